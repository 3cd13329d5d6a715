# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""terraform.terraform_env / env_overrides: what every terraform process csis.infra starts gets."""
from __future__ import annotations

from typing import Any

from ansible_collections.csis.infra.plugins.module_utils.csis import terraform


def _base(tmp_path: Any, **more: str) -> dict:
    return dict({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CSIS_CACHE_DIR": str(tmp_path / "cache"),
                 "CSIS_PROVIDER_MIRROR": str(tmp_path / "no-mirror")}, **more)


def test_go_collector_defaults_unless_the_environment_sets_them(tmp_path: Any) -> None:
    env = terraform.terraform_env(_base(tmp_path))
    assert (env["GOGC"], env["GOMEMLIMIT"]) == ("400", "1GiB")
    assert env["TF_IN_AUTOMATION"] == "1" and env["TF_CLI_CONFIG_FILE"].startswith(str(tmp_path))
    # the operator's choice wins, whole: one of the two set means neither default is added
    assert terraform.terraform_env(_base(tmp_path, GOGC="100"))["GOGC"] == "100"
    assert "GOMEMLIMIT" not in terraform.terraform_env(_base(tmp_path, GOGC="100"))
    mem = terraform.terraform_env(_base(tmp_path, GOMEMLIMIT="3GiB"))
    assert mem["GOMEMLIMIT"] == "3GiB" and "GOGC" not in mem


def test_env_overrides_carry_the_same_settings_to_an_ansible_environment(tmp_path: Any) -> None:
    over = terraform.env_overrides(_base(tmp_path))
    assert set(over) == {"TF_CLI_CONFIG_FILE", "TF_IN_AUTOMATION", "CHECKPOINT_DISABLE", "GOGC", "GOMEMLIMIT"}
    assert terraform.env_overrides(_base(tmp_path, GOGC="off"))["GOGC"] == "off"
