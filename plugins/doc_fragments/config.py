# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
from __future__ import annotations


class ModuleDocFragment:
    """The options every module that loads a configuration tree shares."""

    DOCUMENTATION = r"""
options:
  config_root:
    description: The configuration root (the directory holding C(cfg/_config.yml)).
    type: path
    required: true
  overlays:
    description:
      - Overlay files applied in order (later wins). Relative paths are relative to I(config_root).
      - C(config:) keys replace the file's; C(runtime_builders:) and C(state_backends:) entries
        are deep-merged by name onto the declared entries.
    type: list
    elements: path
    default: []
"""
