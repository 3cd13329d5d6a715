# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""``terraform output -json`` as community.general.terraform asks for it after the role's apply,
with the value of every output terraform marks sensitive replaced by ``(sensitive value)``.

The launcher (``csis-tf-supervise``) runs this for ``output``. terraform prints sensitive
outputs in clear with ``-json``; the module puts what it reads into its result, which Ansible's
async machinery writes to the job's results file (``~/.ansible_async/<job id>``) before
``csis_apply_wait`` reads it. The wait masks them for display, but the file held them in clear
until then, and for good when the wait timed out and the job finished later. Masked here, no
secret output reaches that file or the module's result at all. Nothing the role runs needs the
value: the roots that read another root's outputs read its state (``terraform_remote_state``).

Anything else (no ``-json``, a single named output, a failure, an answer that is not a JSON
object) passes through unchanged, as terraform printed it; stderr and the exit code are
terraform's.
"""
import json
import os
import subprocess
import sys

#: what the approver and the run's result show instead of a sensitive value (plan_verdict.MASKED)
MASKED = "(sensitive value)"


def masked(data):
    """``output -json``'s object with every sensitive output's value masked."""
    out = {}
    for name, output in data.items():
        if isinstance(output, dict) and output.get("sensitive") and "value" in output:
            output = dict(output, value=MASKED)
        out[name] = output
    return out


def main(argv):
    binary = os.environ.get("CSIS_TF_BINARY") or "terraform"
    # the output names asked for (none: all of them), after the flags and their values
    names = [a for i, a in enumerate(argv[1:], 1) if not a.startswith("-") and argv[i - 1] != "-state"]
    if "-json" not in argv or names:
        os.execvp(binary, [binary] + argv)
    proc = subprocess.run([binary] + argv, stdout=subprocess.PIPE, check=False)
    try:
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        sys.stdout.buffer.write(proc.stdout)
        return proc.returncode
    sys.stdout.write(json.dumps(masked(data), indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
