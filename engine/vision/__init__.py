"""Images for the Qwen3.5 vision tower: preprocessing (processor), the tower (tower), 3-axis rotary positions
(positions) and the image placeholder tokens of a prompt (tokens)."""
