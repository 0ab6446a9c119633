"""Golden chains: the JSONL format (`chains`), recording and checking them (`record`), and the
float32 transformers reference engine (`reference`)."""
