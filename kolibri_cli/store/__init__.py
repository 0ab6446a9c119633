"""The model store: the cache of pulled and imported models (`cache`), GGUF conversion (`gguf`),
atomic writes (`atomic`), opening a model by name (`models`), and model info from headers."""
