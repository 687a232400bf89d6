"""The commands, one module each: `train` (vit-train), `eval` (vit-eval), `attention`
(vit-attention), `export` (vit-export), and `base`, what they share (parsing, one-line errors,
exit codes)."""
