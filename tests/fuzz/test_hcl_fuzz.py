# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Fuzz: what render/hcl.py emits for arbitrary strings parses, is in ``terraform fmt`` form,
and is the value terraform sees.

Each example is a batch: many strings become the elements of a list, the keys and values of
an object and the labels of blocks, in one small local-only root (no provider, no backend).
One ``terraform fmt -check -recursive`` and one ``apply`` + ``output -json`` per batch (about
0.3 s). Terraform keeps every string in Unicode normal form C (cty normalises on
construction, escapes included), so the value read back is compared with the NFC of the
input: no encoding can carry a decomposed string through terraform.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import unicodedata
from typing import Any, Dict, List

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from ansible_collections.csis.infra.plugins.module_utils.csis.render import hcl
from ansible_collections.csis.infra.plugins.module_utils.csis.terraform import terraform_env

SCALE = int(os.environ.get("CSIS_FUZZ_SCALE", "1"))

#: characters that matter to HCL, templates, fmt's alignment and terraform's normalisation
TRICKY = ('${}%"\\\n\r\t\x00\x01\x1b\x7f\x85 ~#=[](),.:\'`'
          "\u00a0\u00e9\u0301\u0308\u200b\u200d\u2028\u2029\u202e\ufeff\ufe0f\u212b\uff9e\u0e33\u1100\u1161\u11a8"
          "\u4e2d\U0001f600\U0001f1eb\U0001f1f7\U0001f3fb\U0001f468\U0010fffd")
any_char = st.characters(blacklist_categories=("Cs",))  # lone surrogates cannot be written to a file


def _no_tag_characters(s: str) -> str:
    """Without U+E0000..U+E007F (the emoji tag characters): terraform's normaliser (Go's
    x/text/unicode/norm) drops one before a combining mark ("\U000e0041\u0301" becomes "\u00c1",
    written raw or escaped), so no spelling of such a string reaches terraform intact."""
    return "".join(c for c in s if not 0xE0000 <= ord(c) <= 0xE007F)


strings = st.one_of(
    st.text(any_char, max_size=24),
    st.text(st.sampled_from(TRICKY), max_size=16),
    st.lists(st.sampled_from(["${", "%{", "$${", "%%{", "}", "~}", "${x}", "%{ if x }", "\\", '"', "\\n", "\\u0041",
                              "$", "%", "{", "endif", "\n", "a"]), max_size=8).map("".join),
).map(_no_tag_characters)


def _nfc(v: Any) -> Any:
    if isinstance(v, str):
        return unicodedata.normalize("NFC", v)
    if isinstance(v, list):
        return [_nfc(x) for x in v]
    if isinstance(v, dict):
        return {_nfc(k): _nfc(x) for k, x in v.items()}
    return v


def _terraform(cwd: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["terraform", *args], cwd=cwd, env=terraform_env(), capture_output=True, text=True,
                          check=False)


def _roundtrip(values: List[str], mapping: Dict[str, str], labels: List[str]) -> None:
    locals_block = hcl.Block("locals").attr("v", values).attr("m", mapping).attr("nested", [{"k": v} for v in values[:3]])
    doc = hcl.document(
        hcl.comment_lines("fuzz batch\n" + "\n".join(values[:2])),
        locals_block,
        hcl.Block("output", "v").attr("value", hcl.Raw("local.v")),
        hcl.Block("output", "m").attr("value", hcl.Raw("local.m")),
        hcl.Block("output", "nested").attr("value", hcl.Raw("local.nested")),
    )
    # labels: fmt parses any block type; a subdirectory is not loaded by the apply
    labelled = hcl.document(*[hcl.Block("fuzz", x, x).attr("a", x) for x in labels])
    with tempfile.TemporaryDirectory(prefix="csis-hcl-fuzz-") as tmp:
        with open(os.path.join(tmp, "main.tf"), "w", encoding="utf-8") as fh:
            fh.write(doc)
        os.mkdir(os.path.join(tmp, "labels"))
        with open(os.path.join(tmp, "labels", "main.tf"), "w", encoding="utf-8") as fh:
            fh.write(labelled)
        fmt = _terraform(tmp, "fmt", "-check", "-recursive", "-diff", "-no-color")
        assert fmt.returncode == 0, "terraform fmt -check refused the encoder's output:\n%s%s" % (fmt.stdout, fmt.stderr)
        applied = _terraform(tmp, "apply", "-auto-approve", "-input=false", "-no-color")
        assert applied.returncode == 0, "terraform apply:\n%s%s" % (applied.stdout, applied.stderr)
        out = _terraform(tmp, "output", "-json")
        assert out.returncode == 0, out.stderr
        seen = {k: o["value"] for k, o in json.loads(out.stdout).items()}
    for i, (got, sent) in enumerate(zip(seen["v"], values)):
        assert got == _nfc(sent), "element %d: sent %r, terraform sees %r" % (i, sent, got)
    assert len(seen["v"]) == len(values)
    assert seen["m"] == _nfc(mapping)
    assert seen["nested"] == _nfc([{"k": v} for v in values[:3]])


#: Block labels are the one place ``terraform fmt`` re-spells a string (hclwrite escapes what
#: Go's unicode.IsPrint refuses, as hcl.string does with str.isprintable). The two Unicode
#: databases differ on code points unassigned in Python's (3.11: Unicode 14, terraform's Go:
#: 15): those are left out of labels. And terraform 1.11's fmt DROPS a label holding a '$' or
#: '%' followed by anything ("a%b", "$${x}", even spelled "a\u0025b"): a terraform bug no
#: spelling avoids, so labels here hold neither. Labels come from names (NAME_RE: ASCII
#: letters, digits, '_.-') and fixed words, so neither case reaches a rendered root.
#: fmt also writes a label in NFC (what terraform sees): labels here are NFC already.
labels_text = strings.map(lambda s: unicodedata.normalize(
    "NFC", "".join(c for c in s if unicodedata.category(c) != "Cn" and c not in "$%")))


@pytest.mark.integration
# no shrinking: each step is a terraform run; the assertion messages name the value (fmt's diff,
# the element that came back different)
@settings(max_examples=30 * SCALE, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(values=st.lists(strings, min_size=1, max_size=40),
       # keys equal after NFC would be one key to terraform (a duplicate attribute)
       mapping=st.dictionaries(strings.filter(bool), strings, max_size=12).filter(
           lambda d: len({unicodedata.normalize("NFC", k) for k in d}) == len(d)),
       labels=st.lists(labels_text, max_size=6))
def test_hcl_strings_parse_format_and_round_trip(values: List[str], mapping: Dict[str, str], labels: List[str]) -> None:
    _roundtrip(values, mapping, labels)


# ------------------------------------------------------------------ regression cases
@pytest.mark.integration
@pytest.mark.parametrize("values, mapping, labels", [
    # a combining accent, a ZWJ sequence, a flag in a key: fmt aligns "=" by grapheme clusters
    (["x"], {"a": "x", "cafe\u0301": "y", "\U0001f468\u200d\U0001f468": "z", "\U0001f1eb\U0001f1f7": "w"}, []),
    # a key ending in a newline was written bare ("$" matched before the final newline)
    (["x"], {"abc\n": "y", "for": "z"}, []),
    # a C1 control / a separator in a label: fmt re-escapes labels the way hclwrite does
    (["\x80", "\u2028"], {}, ["\x80", "\u2028", "\x85\u00a0"]),
])
def test_hcl_regressions(values: List[str], mapping: Dict[str, str], labels: List[str]) -> None:
    _roundtrip(values, mapping, labels)


def test_hcl_key_and_string_regressions_offline() -> None:
    """The same fixes, pinned without terraform."""
    assert hcl.key("abc\n") == '"abc\\n"'
    assert hcl.key("abc") == "abc"
    assert hcl.key("cafe\u0301") == '"cafe\\u0301"'
    assert hcl.key("\U0001f1eb\U0001f1f7") == '"\\U0001f1eb\\U0001f1f7"'
    assert hcl.string("\x80\u2028 \u00e9") == '"\\u0080\\u2028 \u00e9"'
    assert hcl.string("\U000e0041") == '"\\U000e0041"'
