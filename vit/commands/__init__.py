"""The commands, one module each: `train` (vit-train), `eval` (vit-eval), `attention`
(vit-attention), `score` (vit-attention score), `export` (vit-export); and what they share:
`base` (parsing, one-line errors, exit codes) and `inputs` (the network and images a command
reads, the device it runs on). Their imports have no cycle (tests/test_commands_imports.py):
`attention` hands `vit-attention score ...` to `score`, and nothing imports a command back."""
