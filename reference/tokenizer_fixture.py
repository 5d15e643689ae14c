#!/usr/bin/env python3
"""Golden fixtures for the byte-level BPE tokenizer (src/titan/data/tokenizer.*).

Writes into tests/fixtures/tokenizer/:
  corpus.txt        the training text: KJV chapters (Debian package bible-kjv) plus
                    multilingual lines written here, so training is not ASCII-only
  gpt2_bpe.json     trained by Hugging Face `tokenizers`: plain ByteLevel pre-tokenizer
                    (GPT-2 regex), merges rewritten in the legacy "a b" string form
  llama3_bpe.json   trained by `tokenizers`: Sequence[Split(Llama-3 regex), ByteLevel],
                    ignore_merges, extra added tokens (lstrip/rstrip/single_word), merges in
                    the [["a", "b"]] array form, a TemplateProcessing post-processor with BOS
  deepseek_v3_bpe.json  trained by `tokenizers` with DeepSeek-V3's three Splits + ByteLevel
                    and its full-width special tokens (written compactly)
  cases.json        ids that `tokenizers` gives for awkward texts, per tokenizer

tests/unit/tokenizer_test.cpp loads these and requires exact equality; it also trains our
tokenizer on corpus.txt with the same settings and requires the same vocab and merges.

  python reference/tokenizer_fixture.py                # regenerate the fixtures
  python reference/tokenizer_fixture.py --check FILE   # load a tokenizer.json that titan saved;
                                                       # if it holds a fixture's model, compare ids

Needs `pip install tokenizers` (tested with 0.23.3) and /usr/bin/bible.
"""
import argparse
import json
import pathlib
import random
import subprocess

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizer"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# DeepSeek-V3's pre-tokenizer: digits in groups of up to three, runs of CJK ideographs and kana,
# then a Llama-3-like pattern that keeps combining marks with letters.
DEEPSEEK_V3_SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]

BIBLE_PASSAGES = ["Gen1:1-Gen6:22", "Ps23:1-Ps23:6", "Jn1:1-Jn2:25"]

MULTILINGUAL_LINES = [
    "Im Anfang schuf Gott Himmel und Erde. Und die Erde war wüst und leer.",
    "Au commencement, Dieu créa les cieux et la terre. La terre était informe et vide.",
    "En el principio creó Dios los cielos y la tierra. Y la tierra estaba desordenada y vacía.",
    "В начале сотворил Бог небо и землю. Земля же была безвидна и пуста.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν.",
    "起初，神创造天地。地是空虚混沌，渊面黑暗；神的灵运行在水面上。",
    "はじめに神は天と地とを創造された。地は形なく、むなしく、やみが淵のおもてにあり。",
    "태초에 하나님이 천지를 창조하시니라. 땅이 혼돈하고 공허하며.",
    "في البدء خلق الله السماوات والأرض. وكانت الأرض خربة وخالية.",
    "בְּרֵאשִׁית בָּרָא אֱלֹהִים אֵת הַשָּׁמַיִם וְאֵת הָאָרֶץ.",
    "Numbers: 3.14159, 2.71828, 1,000,000 and 42 -- also 2024-06-01 12:30:45.",
    "Code: for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; }  // dot product",
    "Emoji: 🙂 🎉 👍🏽 🇯🇵 — and typographic “quotes” ‘too’ … done.",
]

# Pieces a random text is drawn from: whitespace kinds (NEL, NBSP, ideographic space, line
# separator), letters with case and combining marks, digit runs, other number kinds, emoji,
# contractions and every added token, so regex, trie and merge edge cases meet each other.
MIX_PARTS = [" ", "  ", "\n", "\r\n", "\t", "a", "Ab", "7", "123456", "!", "?!", "-", "_", "é", "x\u0301", "ß", "İ",
             "ǅ", "ﬁ", "日本", "👍", "٣", "½", "Ⅻ", "'s", "'LL", "\u00a0", "\u3000", "\u0085", "\u2028", "\x00",
             "word", "<tool>", "<|eot_id|>", "<|bos|>", "<|begin_of_text|>"]


def random_mix(seed, parts):
    rng = random.Random(seed)
    return "".join(rng.choice(MIX_PARTS) for _ in range(parts))


# Texts chosen to stress the pre-tokenizer regex, the byte map, added tokens and BPE edges.
CASES = [
    "",
    " ",
    "\n",
    "Hello, world!",
    "In the beginning God created the heaven and the earth.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\r\nmixed   \n\n\n  end",
    "numbers 1234567890 3.14159 -42 1,000,000 ٣٤٥٦ ½ 12345678901234567890",
    "unicode: naïve café résumé Ünïcödé ß ﬁ Å Å",
    "emoji: 👍🏽 👨‍👩‍👧‍👦 🇯🇵 😀😃",
    "CJK: 你好世界，今天天气很好。日本語のテキスト 한국어 텍스트",
    "scripts: Ελληνικά русский عربى עברית हिन्दी ไทย",
    "contractions: I'm you're he's she'd we'll they've don't CAN'T I'M It'S",
    "' s 's 'S 'll' '''",
    "whitespace oddities: a\u00a0b\u3000c\u2028d\u0085e \u200b f\u2009g\u000bh\u000ci",
    "code: def f(x):\n    return x**2  # comment\n\tif (a && b) { c++; }\n",
    "punctuation!!! ??? ... ---- ==== \"\"\" ``` ¿¡ «»",
    "repeated: aaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbb thethethethe",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "control \x00\x01\x1f\x7f chars",
    "   \n   ",
    "trailing newline\n\n",
    "special inside: <|bos|>Hello<|eos|> and <|bos|><|eos|> adjacent <|bos",
    "llama specials: <|begin_of_text|>Hi there<|eot_id|>\n<|end_of_text|><|begin_of_text|>",
    "deepseek specials: <｜begin▁of▁sentence｜>User: 你好<｜end▁of▁sentence｜>",
    "CJK runs: 漢字かなカナ混じり文ｶﾀｶﾅ、句読点。ＡＢＣ１２３",
    "added: call <tool>   x and <tool>y; a word here, words, sword, word.",
    "word",
    " word ",
    "And God said, Let there be light: and there was light.\n\n  5 And God called the light Day",
    random_mix(seed=1, parts=1000),
]


def corpus_text():
    chapters = []
    for passage in BIBLE_PASSAGES:
        out = subprocess.run(["/usr/bin/bible", "-l0", passage], check=True, capture_output=True, text=True)
        chapters.append(out.stdout.strip("\n"))
    return "\n".join(chapters + MULTILINGUAL_LINES) + "\n"


def corpus_lines(text):
    # One training sequence per line, exactly as the C++ test splits corpus.txt.
    return text.split("\n")


def train_gpt2(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def train_llama3(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens(["<|eot_id|>"])
    tok.add_tokens([AddedToken("<tool>", rstrip=True, normalized=False),
                    AddedToken("word", single_word=True, lstrip=True)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def train_deepseek_v3(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in DEEPSEEK_V3_SPLITS] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def save_with_string_merges(tok, path):
    # Older tokenizer.json files (GPT-2, Llama-3 as published) write each merge as "a b".
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def encode_cases(tok):
    cases = []
    for text in CASES:
        plain = tok.encode(text, add_special_tokens=False)
        with_special = tok.encode(text, add_special_tokens=True)
        # Not always the text: added tokens with lstrip/rstrip swallow the whitespace beside them.
        decoded = tok.decode(plain.ids, skip_special_tokens=False)
        cases.append({"text": text, "ids": plain.ids, "ids_with_special": with_special.ids, "decoded": decoded})
    return cases


def write_cases(fixture, path):
    # One case per line: small on disk, and a regenerated fixture diffs case by case.
    lines = ["{"]
    for t, (name, entry) in enumerate(fixture.items()):
        lines.append(f' {json.dumps(name)}: {{"vocab_size": {entry["vocab_size"]}, "cases": [')
        cases = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in entry["cases"]]
        lines.append(",\n".join("  " + c for c in cases))
        lines.append(" ]}" + ("," if t + 1 < len(fixture) else ""))
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def generate():
    OUT.mkdir(parents=True, exist_ok=True)
    text = corpus_text()
    (OUT / "corpus.txt").write_text(text, encoding="utf-8")
    lines = corpus_lines(text)

    gpt2 = train_gpt2(lines)
    save_with_string_merges(gpt2, OUT / "gpt2_bpe.json")
    llama3 = train_llama3(lines)
    llama3.save(str(OUT / "llama3_bpe.json"), pretty=True)
    train_deepseek_v3(lines).save(str(OUT / "deepseek_v3_bpe.json"), pretty=False)

    # Re-load from disk so the ids come from exactly the files the C++ test reads.
    fixture = {}
    for name in ["gpt2_bpe.json", "llama3_bpe.json", "deepseek_v3_bpe.json"]:
        tok = Tokenizer.from_file(str(OUT / name))
        fixture[name] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": encode_cases(tok)}
    write_cases(fixture, OUT / "cases.json")
    for path in sorted(OUT.iterdir()):
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")


def check(path):
    # A file titan saved must load here; trained on corpus.txt like a fixture, it must also give
    # that fixture's ids, except on texts holding added tokens the fixture has and it lacks.
    tok = Tokenizer.from_file(path)
    print(f"{path}: loaded, vocab size {tok.get_vocab_size(with_added_tokens=True)}")
    fixture = json.loads((OUT / "cases.json").read_text(encoding="utf-8"))
    for name, entry in fixture.items():
        reference = Tokenizer.from_file(str(OUT / name))
        if reference.get_vocab(with_added_tokens=False) != tok.get_vocab(with_added_tokens=False):
            continue
        missing = [t.content for t in reference.get_added_tokens_decoder().values()
                   if tok.token_to_id(t.content) is None]
        cases = [c for c in entry["cases"] if not any(m in c["text"] for m in missing)]
        same = all(tok.encode(c["text"], add_special_tokens=False).ids == c["ids"] for c in cases)
        print(f"  same model as {name}; ids equal on {len(cases)} of {len(entry['cases'])} cases: {same}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", metavar="FILE", help="load a tokenizer.json saved by titan")
    args = parser.parse_args()
    if args.check:
        check(args.check)
    else:
        generate()
