"""Speculative decoding with the checkpoint's MTP head: the engine's side of it, the device rounds, which drafts are
kept, and how many drafts a round makes."""
