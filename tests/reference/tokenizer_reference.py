#!/usr/bin/env python3
"""Reference tokenizers for tests/reference/test_tokenizer_reference.cpp, written here from the
published algorithms (no `transformers` or `regex` package needed).

usage: tokenizer_reference.py IN.json OUT.json

IN.json: {"bpe": {"vocab": path, "merges": path, "texts": [...], "train_texts": [...],
          "train_vocab_size": n, "train_specials": [...]},
          "wordpiece": {"vocab": path, "texts": [...], "lower_case": bool}}
OUT.json: {"bpe_ids": [[...]], "pretokens": [[...]], "train_merges": [...],
           "wordpiece_tokens": [[...]]}

* GPT-2 byte-level BPE as in openai/gpt-2 encoder.py: bytes_to_unicode, the pre-tokenisation
  pattern (its \\p{L} / \\p{N} / \\s classes built from unicodedata, since `re` lacks them), and
  the merge loop (lowest-ranked pair first, all occurrences left to right).
* A naive BPE trainer: count adjacent pairs over the word counts, merge the most frequent
  (ties: the smaller pair of strings), repeat.
* BERT's BasicTokenizer + WordpieceTokenizer as in google-research/bert tokenization.py.
"""
import collections
import json
import re
import sys
import unicodedata


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def char_class(pred):
    parts, start = [], None
    for cp in range(0x110000 + 1):
        ok = cp < 0x110000 and not (0xD800 <= cp <= 0xDFFF) and pred(chr(cp))
        if ok and start is None:
            start = cp
        elif not ok and start is not None:
            a, b = start, cp - 1
            parts.append(re.escape(chr(a)) if a == b else re.escape(chr(a)) + "-" + re.escape(chr(b)))
            start = None
    return "".join(parts)


WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def gpt2_pattern():
    L = char_class(lambda c: unicodedata.category(c).startswith("L"))
    N = char_class(lambda c: unicodedata.category(c).startswith("N"))
    S = WHITE_SPACE
    return re.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?[%s]+| ?[%s]+| ?[^%s%s%s]+|[%s]+(?![^%s])|[%s]+"""
        % (L, N, S, L, N, S, S, S))


def get_pairs(word):
    return set(zip(word, word[1:]))


class Gpt2Bpe:
    def __init__(self, vocab_path, merges_path, pattern):
        with open(vocab_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        merges = [tuple(l.split()) for l in lines if l.strip()]
        self.ranks = dict(zip(merges, range(len(merges))))
        self.byte_encoder = bytes_to_unicode()
        self.pat = pattern

    def bpe(self, token):
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return list(word)
        while True:
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        return list(word)

    def encode(self, text):
        ids = []
        for piece in self.pat.findall(text):
            token = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token))
        return ids


def train_bpe(texts, vocab_size, specials, pattern):
    be = bytes_to_unicode()
    counts = collections.Counter()
    for t in texts:
        for piece in pattern.findall(t):
            counts[tuple(be[b] for b in piece.encode("utf-8"))] += 1
    words = dict(counts)
    size = len(specials) + 256
    seen = set(specials) | set(be.values())
    merges = []
    while size < vocab_size:
        pairs = collections.Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += n
        if not pairs:
            break
        best_n = max(pairs.values())
        if best_n < 2:
            break
        best = min(p for p, n in pairs.items() if n == best_n)
        merges.append(best[0] + " " + best[1])
        merged = best[0] + best[1]
        if merged not in seen:
            seen.add(merged)
            size += 1
        new_words = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == best[0] and w[i + 1] == best[1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + n
        words = new_words
    return merges


# --- BERT (google-research/bert tokenization.py) ---------------------------------------------

def _is_whitespace(c):
    if c in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(c) == "Zs"


def _is_control(c):
    if c in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(c) in ("Cc", "Cf")


def _is_punctuation(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def _is_chinese_char(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
            0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or
            0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text, lower):
    out = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or _is_control(c):
            continue
        out.append(" " if _is_whitespace(c) else c)
    text = "".join(out)
    out = []
    for c in text:
        out.append(" %s " % c if _is_chinese_char(ord(c)) else c)
    tokens = []
    for token in "".join(out).split():
        if lower:
            token = token.lower()
            token = "".join(c for c in unicodedata.normalize("NFD", token)
                            if unicodedata.category(c) != "Mn")
        cur = []
        for c in token:
            if _is_punctuation(c):
                if cur:
                    tokens.append("".join(cur))
                    cur = []
                tokens.append(c)
            else:
                cur.append(c)
        if cur:
            tokens.append("".join(cur))
    return " ".join(tokens).split()


def wordpiece(tokens, vocab, unk="[UNK]", max_chars=100):
    out = []
    for token in tokens:
        chars = list(token)
        if len(chars) > max_chars:
            out.append(unk)
            continue
        bad, start, subs = False, 0, []
        while start < len(chars):
            end, cur = len(chars), None
            while start < end:
                s = "".join(chars[start:end])
                if start > 0:
                    s = "##" + s
                if s in vocab:
                    cur = s
                    break
                end -= 1
            if cur is None:
                bad = True
                break
            subs.append(cur)
            start = end
        out.extend([unk] if bad else subs)
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    pat = gpt2_pattern()
    out = {}
    b = cfg["bpe"]
    out["pretokens"] = [pat.findall(t) for t in b["texts"]]
    out["train_merges"] = train_bpe(b["train_texts"], b["train_vocab_size"], b["train_specials"],
                                    pat)
    enc = Gpt2Bpe(b["vocab"], b["merges"], pat)
    out["bpe_ids"] = [enc.encode(t) for t in b["texts"]]
    w = cfg["wordpiece"]
    with open(w["vocab"], encoding="utf-8") as f:
        vocab = set(l.strip() for l in f if l.strip())
    out["wordpiece_tokens"] = [wordpiece(basic_tokenize(t, w["lower_case"]), vocab)
                               for t in w["texts"]]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
