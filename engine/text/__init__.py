"""Tokens and text: the tokenizer, streaming detokenization, stop strings, a reply's labelled pieces, and grammar
constraints."""
