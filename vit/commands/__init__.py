"""The commands, one module each: `train` (vit-train), `eval` (vit-eval, vit-eval predict),
`curves` (vit-eval curves), `attention` (vit-attention), `score`, `heads` and `patch`
(vit-attention score, heads, patch), `export` (vit-export) and `chunks` (vit-chunks); and `base`,
what they share: their options, declared once as dataclasses (`Source`, `Images`, `Analysis`), the
network and images they read, parsing with one-line errors, exit codes. Each command is a
`base.Command` (its options, its function, its subcommands); their imports have no cycle
(tests/test_commands_imports.py)."""
