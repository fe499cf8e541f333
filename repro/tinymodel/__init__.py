"""The miniature's tiny model: a Qwen3-architecture checkpoint built from a seed, its recipe tokenizer (the
harness's fixed texts as single tokens) and the vocabulary helpers the harness adapters use to find those texts."""
