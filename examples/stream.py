"""Stream speech from Chat.infer(stream=True): chunks arrive while the engine is still generating.

    python examples/stream.py --model demo "First text." "Second text."

Each yield holds one new (maybe empty) float32 24 kHz chunk per text; a text's chunks concatenate to exactly the
waveform that infer(stream=False) returns for the same seed. The clips are written as stream_<i>.wav.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio import SAMPLE_RATE, write_wav
from chattts_velocity.demo import ensure_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="*", default=["Streaming keeps the wait short. The rest follows."])
    parser.add_argument("--model", default="demo", help="asset folder, or 'demo' for random demo weights")
    parser.add_argument("--no-verify", action="store_true", help="skip the sha256 check (custom or random weights)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-token", type=int, default=300, help="random demo weights rarely stop")
    parser.add_argument("--stream-batch", type=int, default=24, help="new steps (21.3 ms each) per chunk")
    args = parser.parse_args()

    root, verify = ensure_model(args.model)
    chat = Chat()
    chat.load(source="custom", custom_path=root, verify=verify and not args.no_verify, use_vllm=True,
              dtype=args.dtype)
    params = InferCodeParams(manual_seed=args.seed, max_new_token=args.max_new_token, stream_batch=args.stream_batch,
                             spk_emb=chat.sample_random_speaker(), show_tqdm=False)
    clips: list[list[np.ndarray]] = [[] for _ in args.texts]
    start = time.perf_counter()
    for chunks in chat.infer(args.texts, stream=True, skip_refine_text=True, params_infer_code=params):
        now = time.perf_counter() - start
        for i, chunk in enumerate(chunks):
            if len(chunk):
                clips[i].append(chunk)
                print(f"{now:6.2f} s  text {i}: +{len(chunk) / SAMPLE_RATE:.2f} s of audio")
    for i, parts in enumerate(clips):
        write_wav(f"stream_{i}.wav", np.concatenate(parts))
        print(f"stream_{i}.wav  {sum(map(len, parts)) / SAMPLE_RATE:.2f} s")


if __name__ == "__main__":
    main()
