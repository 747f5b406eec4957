"""What the bot and the runner agree on, in one torch-free package: the job spec, the events and every cap on
them, the exit codes (spec.py); dataset records, bounded reads and prompts (records.py, reading.py,
prompts.py); tokenizing, fitting to seq_len, the eval split, packing and the step rules (tokenize.py,
example.py, fitting.py, packing.py, steps.py); signing, sealing and manifests (integrity.py, sealed.py,
manifest.py); what of an output is public and the Hub push (publish.py).

The bot imports nothing else of the runner (tests/test_layers.py); these modules import nothing of the runner
outside this package, and never torch or transformers (tests/runner/test_contract.py).
"""
