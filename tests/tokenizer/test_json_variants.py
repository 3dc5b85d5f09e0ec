"""Tokenizer::from_hf_files against HF `tokenizers` on small tokenizers built here (label `unit`).

Each variant trains a small BPE with `tokenizers`, sets the normalizer / pre-tokenizer / decoder /
post-processor / added-token flags that byte-level (GPT-2, Llama 3, Qwen2) and SentencePiece-
converted (Gemma, Llama 2) tokenizer.json files use, saves it, and checks that our tokenizer
loaded from that file gives HF's ids and decodes on fixture lines and random strings.
"""
import json
import os
import random

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from corpus import extra_lines
from oracle import first_mismatches, run_tool, scratch_dir

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>",
            "<start_of_turn>", "<mask>", "[SEP]", "[CLS]", "<s>", "</s>"]
PLAIN_ADDED = ["<think>", "</think>", "word", "Hello", "ÉCOLE", "<b>", "\n"]


def random_texts(count=1500, seed=42):
    """Strings mixing scripts, emoji, whitespace runs, digits and the added tokens' texts."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ", "\t", "\n",
        "\r\n", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`", "éèêëàâäôöûüçñßøåæœ", "中文字符测试汉字",
        "ひらがなカタカナ", "한국어", "русский", "ελληνικά", "עברית", "العربية", "हिन्दी",
        "😀😂👍🏽🎉🚀", "\u200d\u0301\u00a0\u3000\u2028\u0085\u180e\ufeff", "ǅİıſK",
    ]
    words = SPECIALS + PLAIN_ADDED + ["'s", "'LL", "x", "xx", "1234567", " word ", " Hello ", "HELLO",
                                      "école", "  <mask>  ", "[SEP]   x"]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.2:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        texts.append("".join(parts))
    return texts


def training_text():
    return extra_lines() * 3 + random_texts(400, seed=7)


def byte_level_model(pre_tokenizer, normalizer=None, vocab_size=700, **bpe_options):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    if bpe_options:
        model = json.loads(tok.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        tok.model = models.BPE(vocab=model["vocab"], merges=merges, **bpe_options)
    tok.decoder = decoders.ByteLevel()
    return tok


def sentencepiece_model():
    """A BPE in SentencePiece spelling (U+2581 for spaces) with byte-fallback tokens."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Replace(" ", "\u2581")
    trainer_tok.pre_tokenizer = pre_tokenizers.Split(Regex("\u2581?[^\u2581]+|\u2581+"), "isolated")
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False, limit_alphabet=120,
                                  special_tokens=["<unk>"])
    trainer_tok.train_from_iterator(training_text(), trainer)
    model = json.loads(trainer_tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>",
                               fuse_unk=True))
    return tok


def variant_gpt2():
    tok = byte_level_model(pre_tokenizers.ByteLevel(add_prefix_space=False))
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def variant_gpt2_prefix_space():
    tok = byte_level_model(pre_tokenizers.ByteLevel(add_prefix_space=True))
    tok.add_special_tokens(["<|endoftext|>", AddedToken("<mask>", special=True, normalized=False)])
    return tok


def variant_llama3():
    tok = byte_level_model(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=True)
    tok.add_special_tokens(["<|begin_of_text|>", "<|eot_id|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def variant_qwen2():
    tok = byte_level_model(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizer=normalizers.NFC())
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    return tok


def variant_flags():
    """Normalizers, split behaviours and added-token flags together."""
    tok = byte_level_model(
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(" ", "merged_with_next"),
            pre_tokenizers.Split(Regex(r"\d+"), "contiguous"),
            pre_tokenizers.Split(Regex(r"[,;]"), "removed"),
            pre_tokenizers.Split(Regex(r"[aeiou]+"), "merged_with_previous", invert=True),
            pre_tokenizers.Split(Regex(r"x*"), "isolated"),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]),
        normalizer=normalizers.Sequence([
            normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace(Regex(r"\s{3,}"), "  "),
            normalizers.Replace("ß", "ss"), normalizers.NFD(), normalizers.NFKD(), normalizers.NFC()]))
    tok.add_special_tokens([
        AddedToken("<mask>", lstrip=True, special=True, normalized=False),
        AddedToken("[SEP]", rstrip=True, special=True, normalized=False),
        AddedToken("[CLS]", special=True, normalized=False)])
    # Normalized added tokens are not special here: HF's decode(skip_special_tokens) looks special
    # tokens up by their normalized text and so never skips a normalized special token.
    tok.add_tokens([AddedToken("word", single_word=True, normalized=False),
                    AddedToken("Hello", normalized=True), AddedToken("ÉCOLE", normalized=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                 ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


def variant_gemma_like():
    tok = sentencepiece_model()
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken("<start_of_turn>", special=True, normalized=False),
                            AddedToken("<eos>", special=True, normalized=False)])
    tok.add_tokens([AddedToken("\n", normalized=False), AddedToken("<b>", normalized=False)])
    return tok


def variant_llama2_like():
    tok = sentencepiece_model()
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False),
                            AddedToken("</s>", special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


VARIANTS = {
    "gpt2": variant_gpt2,
    "gpt2_prefix_space": variant_gpt2_prefix_space,
    "llama3": variant_llama3,
    "qwen2": variant_qwen2,
    "flags": variant_flags,
    "gemma_like": variant_gemma_like,
    "llama2_like": variant_llama2_like,
}


@pytest.fixture(scope="module")
def texts():
    return extra_lines() + random_texts()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_matches_hf(name, texts):
    path = os.path.join(scratch_dir(), f"variant_{name}.tokenizer.json")
    VARIANTS[name]().save(path)
    hf = Tokenizer.from_file(path)  # what the file says, as HF reads it
    args = ["--json", path]
    for add_special in (False, True):
        expected = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special)]
        ours = run_tool(args, "encode", texts, *(["--add-special"] if add_special else []))
        assert ours == expected, f"{name} add_special={add_special}\n" + first_mismatches(texts, expected, ours)
    hf.encode_special_tokens = True
    expected_plain = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    ours_plain = run_tool(args, "encode", texts, "--no-parse-special")
    assert ours_plain == expected_plain, f"{name} plain\n" + first_mismatches(texts, expected_plain, ours_plain)
    for skip in (False, True):
        expected_text = hf.decode_batch(ours, skip_special_tokens=skip)
        ours_text = run_tool(args, "decode", ours, *(["--skip-special"] if skip else []))
        assert ours_text == expected_text, f"{name} decode skip_special={skip}\n" + first_mismatches(
            [str(i) for i in ours], expected_text, ours_text)
