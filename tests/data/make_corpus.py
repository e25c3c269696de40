#!/usr/bin/env python3
"""Writes tests/data/tokenizer_corpus.txt: the lines the JS reference check tokenizes.

Deterministic (fixed seed). Mixes code (C++, Python, JS, Rust), English prose, whitespace
runs (tabs, many spaces, trailing spaces, blank lines), numbers, CJK, emoji (ZWJ sequences,
skin tones, flags), accented Latin (precomposed and decomposed), contractions and
punctuation runs. Avoids characters whose class differs between Unicode versions and
regex engines (U+0085, U+FEFF, unassigned code points).
Run: python3 tests/data/make_corpus.py > tests/data/tokenizer_corpus.txt
"""
import random

rng = random.Random(20240611)

CODE = [
    "#include <vector>", "int main(int argc, char** argv) {", "  return 0;", "}",
    "template <class T> struct Box { T value; };", "std::vector<int32_t> ids{1, 2, 3};",
    "for (std::size_t i = 0; i < n; ++i) sum += a[i] * b[i];",
    "auto [it, inserted] = map.try_emplace(key, 42);", "#define RT_ASSERT(c) do { if (!(c)) abort(); } while (0)",
    "def encode(self, text: str) -> list[int]:", "    return [self.vocab[t] for t in text.split()]",
    "if __name__ == \"__main__\":", "    main()", "class Foo(Bar):", "    pass",
    "print(f\"{name!r} has {len(items):>5} items\")", "lambda x, y: (x ** 2 + y ** 2) ** 0.5",
    "const sum = (a, b) => a + b;", "export default async function handler(req, res) {",
    "  const { data } = await fetch(`${base}/v1/models`).then(r => r.json());",
    "document.querySelectorAll('div.item > a[href^=\"https\"]').forEach(el => el.remove());",
    "fn main() -> Result<(), Box<dyn Error>> {", "    let v: Vec<u8> = vec![0xde, 0xad, 0xbe, 0xef];",
    "    println!(\"{:?}\", v.iter().map(|b| b.wrapping_add(1)).collect::<Vec<_>>());",
    "impl<'a> Iterator for Tokens<'a> { type Item = &'a str; }", "match x { Some(0) => {}, _ => unreachable!() }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "$ git log --oneline | head -n 5 && echo \"done\"", "x += 1; y -= 2; z *= 3; w /= 4; q %= 5;",
    "if (a && b || !c) { return a != b ? a : b; }", "ptr->next = nullptr; // TODO(bob): free it",
    "/* block comment */ int* p = &x; **pp = 0;", "<div class=\"row\"><span>{{ value }}</span></div>",
    "{\"name\": \"tandem\", \"version\": \"0.1.0\", \"ok\": true, \"n\": null}",
    "key = value  # comment", "[section.sub]", "---", "- item one", "* bullet", "> quoted text",
]

PROSE = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the sunshine with her dog, Max.",
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged that a single man must be in want of a wife.",
    "We'll see; they're sure it'd work, but I'm not, and you've been warned.",
    "Don't panic. Isn't it odd? He'd've known. Y'all ain't ready.",
    "IT'S LOUD. THEY'RE HERE. WE'VE GOT IT. I'M FINE. YOU'LL SEE. SHE'D GO.",
    "The model's latency (p99) dropped from 412 ms to 87 ms after the change.",
    "Prefill and decode run on separate instances; KV moves over RDMA.",
    "Mr. Smith paid $1,234.56 on 2024-03-15 at 10:45:00 UTC -- a 12.5% increase.",
    "Wait... what?! No way!!! Really??? Yes... (maybe) [citation needed] {sic}",
    "e.g., i.e., etc., vs., a.k.a., Ph.D., U.S.A., 3 p.m.",
    "\"Quoted,\" she said, 'single quoted', and ‘curly’ “double” «guillemets».",
    "A long-term, well-known, state-of-the-art, up-to-date, end-to-end test.",
]

CJK = [
    "日本語のテキストを正しく分割できるか確認します。", "東京タワーは三百三十三メートルです。",
    "ひらがな カタカナ 漢字 まじり の ぶんしょう", "中文分词测试：我们今天去北京天安门广场。",
    "人工智能正在改变世界，模型推理需要低延迟。", "繁體中文與簡體中文混合測試",
    "한국어 문장도 토큰화해야 합니다.", "안녕하세요, 세계! 반갑습니다.", "서울특별시 강남구 테헤란로 123",
    "全角記号：（）「」『』【】！？。、", "数字１２３と半角123の混在", "Mixed 日本 English 中文 한국 text",
]

EMOJI = [
    "😀", "😂🤣", "👍", "👍🏻", "👍🏽", "👍🏿", "👋🏼 hello", "👨‍👩‍👧‍👦", "👩‍💻 coding", "🧑🏾‍🚀",
    "🏳️‍🌈", "🇯🇵🇰🇷🇨🇳🇺🇸", "❤️", "✨🎉🎊", "🐍 python 🦀 rust", "⭐️⭐️⭐️", "1️⃣2️⃣3️⃣", "🤷‍♀️",
]

ACCENTED = [
    "café naïve résumé façade coöperate", "Straße Größe Übermaß Ärger Öl", "São Paulo, Curaçao, Ångström",
    "El niño comió piñata en España.", "Crème brûlée à la française, déjà vu.", "Łódź, Kraków, Gdańsk, Wrocław",
    "Dvořák, Škoda, Čapek, Žižkov", "İstanbul ışık ğüşöç", "ÀÉÎÕÜ àéîõü ÇÑ çñ",
    "cafe\u0301 (decomposed), A\u030angstro\u0308m, n\u0303", "Ελληνικά κείμενα", "Русский текст, ёлка",
    "עברית", "العربية", "हिन्दी भाषा", "ไทย ภาษา",
]

NUMBERS = [
    "0", "42", "3.14159265358979", "-17", "1e-9", "6.022e23", "1,000,000", "0xFF 0b1010 0o17",
    "2024-01-01T00:00:00Z", "192.168.0.1:8080", "v1.2.3-rc.4+build.5", "12345678901234567890",
    "(1 + 2) * 3 / 4 - 5 % 6 = 0.75", "π ≈ 3.14, √2 ≈ 1.414, ∞", "½ ¼ ¾ ² ³", "１２３４５",
]

PUNCT = [
    "!!!", "???", "...", "---", "===", "***", "###", "~~~", "<<<>>>", "(((())))", "[[[]]]", "{{{}}}",
    ";;;", ":::", ",,,", "'''", "\"\"\"", "```", "@@@", "$$$", "%%%", "^^^", "&&&", "|||", "\\\\\\",
    "//", "/*", "*/", "->", "=>", "::", "!=", "==", "<=", ">=", "+=", "-=", "&&", "||", "?.", "??",
    "!?!?", "—–-", "…", "•·", "§¶", "©®™", "°±×÷",
]

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or "
         "have an they which one you were her all she there would their we him been has when "
         "who will more no if out so said what up its about into than them can only other new "
         "token cache prefix decode prefill router gateway actor block tier latency").split()


def whitespace_variant(text):
    kind = rng.randrange(8)
    if kind == 0:
        return text + " " * rng.randrange(1, 6)
    if kind == 1:
        return " " * rng.randrange(1, 9) + text
    if kind == 2:
        return "\t" * rng.randrange(1, 4) + text
    if kind == 3:
        return text.replace(" ", "  ")
    if kind == 4:
        return text.replace(" ", " \t ")
    return text


def random_sentence():
    words = [rng.choice(WORDS) for _ in range(rng.randrange(3, 16))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", "!", "?", "...", ";", ":", ","])


def mixed_line():
    parts = []
    for _ in range(rng.randrange(2, 6)):
        pool = rng.choice([CODE, PROSE, CJK, EMOJI, ACCENTED, NUMBERS, PUNCT])
        parts.append(rng.choice(pool))
    sep = rng.choice([" ", "  ", "\t", "", " | ", ", "])
    return sep.join(parts)


def main():
    lines = []
    for pool in (CODE, PROSE, CJK, EMOJI, ACCENTED, NUMBERS, PUNCT):
        lines.extend(pool)
    lines.extend(["", "", " ", "    ", "\t", "\t\t  \t", " " * 40, "a" * 200, "ab " * 50,
                  "x" + " " * 20 + "y", "end with tab\t", "        indented code line();"])
    while len(lines) < 1100:
        r = rng.random()
        if r < 0.3:
            line = random_sentence()
        elif r < 0.55:
            line = rng.choice(CODE)
        elif r < 0.85:
            line = mixed_line()
        else:
            line = rng.choice(CJK + EMOJI + ACCENTED)
        lines.append(whitespace_variant(line))
        if rng.random() < 0.04:
            lines.append("")
    for line in lines:
        assert "\n" not in line and "\r" not in line
    print("\n".join(lines))


if __name__ == "__main__":
    main()
