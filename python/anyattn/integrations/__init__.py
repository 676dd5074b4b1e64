"""Integrations with other libraries. Each submodule imports its host library only when used:
``anyattn.integrations.transformers`` (AttentionInterface) and ``anyattn.integrations.sglang``
(vision attention backend)."""
