"""CPU cost of the text normaliser (Normalizer: numbers, symbols, wetext) per 1,000 characters, by input kind.

Each kind is a text of --chars characters that does not repeat itself (made from a fixed seed), except the hostile
units, which repeat by nature: English and Chinese prose with a number now and then, number-dense English and
Chinese, random digits (one run, and groups), and the server's hostile units (" ,", "9 ", "-", ...). Every
measurement starts with wetext's memo emptied (numbers.SpokenText), so a kind pays for its own readings; the
figure is the median of --rounds of process CPU time (a busy host inflates it less than wall time). Target: at most
20 ms per 1,000 characters for every kind.

    python -m benchmarks.bench_normalizer                 # 4,096 characters a kind, 3 rounds
    python -m benchmarks.bench_normalizer --quick         # 1,024 characters, 1 round: a smoke run
    python -m benchmarks.bench_normalizer --out results/normalizer.json
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from chattts_velocity.text import Normalizer
from chattts_velocity.text.numbers import SpokenText

TARGET_MS = 20.0
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their been has when who will more if no out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way "
         "well down should because each just those people how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while last might us "
         "great old year off come since against go came right used take three").split()
NAMES = "Anna Boris Clara David Elena Frank Grace Henry Iris James London Paris Berlin Sydney River Ocean".split()
HAN = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多"
UNITS = (" ,", "9 ", "-", "+1-555-555-5555 ", "1,000,")


def english(rng: random.Random, chars: int, number_every: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        sentence = [rng.choice(NAMES)] + [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
        for i in range(1, len(sentence)):
            if rng.randrange(number_every) == 0:
                sentence[i] = rng.choice([str(rng.randint(2, 99999)), f"{rng.randint(1, 12)}:{rng.randint(10, 59)}",
                                          f"${rng.randint(1, 999)}.{rng.randint(10, 99)}", f"{rng.randint(1, 99)}%"])
        words += sentence[:-1] + [sentence[-1] + rng.choice([".", ".", ",", "?", "!"])]
    return " ".join(words)[:chars]


def chinese(rng: random.Random, chars: int, number_every: int) -> str:
    out: list[str] = []
    while sum(map(len, out)) < chars:
        clause = "".join(rng.choice(HAN) for _ in range(rng.randint(4, 14)))
        if rng.randrange(number_every) == 0:
            clause += rng.choice([f"{rng.randint(2, 9999)}元", f"{rng.randint(1990, 2030)}年{rng.randint(1, 12)}月",
                                  f"{rng.randint(1, 99)}%"])
        out.append(clause + rng.choice("，，。！"))
    return "".join(out)[:chars]


def kinds(chars: int) -> dict[str, str]:
    rng = random.Random(20240)
    texts = {
        "english_prose": english(rng, chars, 40), "english_numbers": english(rng, chars, 4),
        "chinese_prose": chinese(rng, chars, 6), "chinese_numbers": chinese(rng, chars, 1),
        "random_digits": "".join(rng.choice("0123456789") for _ in range(chars)),
        "digit_groups": " ".join(str(rng.randint(0, 99999)) for _ in range(chars))[:chars],
    }
    texts.update({f"hostile {unit.strip() or repr(unit)}": (unit * (chars // len(unit) + 1))[:chars] for unit in UNITS})
    return texts


def forget_readings(normalizer: Normalizer) -> None:
    for fn in normalizer.normalizers.values():
        if isinstance(fn, SpokenText):
            fn.forget()


def cpu_ms(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,024 characters, one round")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    chars, rounds = (1024, 1) if args.quick else (args.chars, args.rounds)
    normalizer = Normalizer()
    normalizer("Warm up 12 and 三点.")
    results = {}
    for kind, text in kinds(chars).items():
        costs = []
        for _ in range(rounds):
            forget_readings(normalizer)
            costs.append(cpu_ms(lambda text=text: normalizer(text, dropped=set())))
        per_k = statistics.median(costs) * 1000 / len(text)
        results[kind] = round(per_k, 2)
        print(f"{kind:24s} {per_k:8.2f} ms CPU per 1,000 characters", file=sys.stderr)
    doc = {"chars": chars, "rounds": rounds, "target_ms_per_1000_chars": TARGET_MS, "host": platform.processor()
           or platform.machine(), "ms_cpu_per_1000_chars": results,
           "over_target": sorted(k for k, v in results.items() if v > TARGET_MS)}
    print(json.dumps(doc, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
