"""Parity stage: drive the reference `chattts==0.2.5` package as a black box (runs INSIDE the reference venv).

Usage: ``python ref_runner.py REQUEST.json OUT.npz``. Reads a JSON request, writes every result array to OUT.npz.

Request (JSON object)::

    {"asset_root": "/dir",            # holds asset/{gpt,tokenizer,*.safetensors} (or those entries directly)
     "size": "tiny" | "full",         # "tiny" shrinks the reference Config (see TINY_OVERRIDES) before loading
     "inputs": "/dir/inputs.npz",     # optional; {"$array": "key"} anywhere in a task is replaced by inputs[key]
     "tasks": [{"name": "t0", "kind": "<kind>", ...fields...}, ...]}

Task kinds and fields (outputs are stored under "<name>/<field>"; a list of arrays under "<name>/<field>/<i>"):

* infer_code: texts [str] (already normalised), params {InferCodeParams fields: prompt, spk_emb, spk_smp, txt_smp,
  temperature (float | [4]), top_P, top_K, repetition_penalty, min_new_token, max_new_token, manual_seed,
  ensure_non_empty}, torch_seed (int | null: global RNG seed before generating), decode (["decoder", "dvae"]).
  Runs Chat._infer_code with return_hidden=True (skip_refine_text, split_text=False semantics) ->
  prompt_ids [B,L,4], prompt_mask [B,L], codes/b [T_b,4] int64, hidden/b [T_b,H], top2_gap [S,B,4], top1 [S,B,4],
  then for each decode d: mel_<d> [B,100,2*T_max], wav_<d> [B,(2*T_max-1)*256]. yielded (bool) is False when
  the reference generator yielded nothing (a seeded run whose EOS came at step 0): then only prompt_* and top*.
* refine_text: texts, params {RefineTextParams fields}, torch_seed -> prompt_ids, prompt_mask, ids/b [T_b]
  (EOS excluded), filtered/b (ids < [break_0]), text [B] (decoded filtered ids), top2_gap [S,B], top1 [S,B],
  yielded (as for infer_code).
* sample_audio_speaker: wav [N] float32 (24 kHz mono) -> spk_smp (str), codes [4,T] int32.
* vocos_decode: mel [B,100,T]; vocos_path (optional: a Vocos.safetensors whose sizes are read from its shapes;
  default: the loaded Chat's Vocos) -> wav [B,(T-1)*256].
* processors: logits [R,V], history [R,G] int, temperature (float or [R], default 1), repetition_penalty, top_P, top_K
  (null = stage off), num_code (the penalty's max_input_ids) -> after_temperature, after_penalty, after_top_p,
  after_top_k [R,V] (each stage's output; a disabled stage repeats its input).
* speaker: seed (int | null), dim (default 768), spk_stat (b14 string, default the reference Config's),
  spk_emb (str | null) -> spk_emb_random (str) + random_vector [dim] fp16 when seed is given;
  normalized [dim] float32 (the row Speaker.apply writes into the embedding) when spk_emb is given.
* tokenize: texts, prompt ([4,P] int array | spk_smp string | null), decorate (null | "code" | "text"),
  decorate_params {prompt, txt_smp, spk_emb} -> input_ids [N,L,4], attention_mask [N,L], text_mask [N,L], decorated [N].

"top2_gap" is the gap between the two best logits of each sampling row after temperature, repetition penalty,
TopP/TopK and the min_new_token EOS mask, rescaled by the row's temperature (raw-logit units); "top1" is its argmax.
Metadata: "_meta/versions" (JSON string of package versions). Exit status 0 on success; errors go to stderr.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Reference module sizes for the team's tiny checkpoint (TEAM_BRIEF "Tiny test-size checkpoint").
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "gpt": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2},
    "embed": {"hidden_size": 64},
    "decoder": {"idim": 32, "odim": 32, "hidden": 32, "n_layer": 2, "bn_dim": 16},
    "dvae.encoder": {"idim": 32, "odim": 64, "hidden": 32, "n_layer": 2, "bn_dim": 16},
    "dvae.decoder": {"idim": 32, "odim": 32, "hidden": 32, "n_layer": 2, "bn_dim": 16},
    "dvae.vq": {"dim": 64},
    "vocos.backbone.init_args": {"dim": 32, "intermediate_dim": 64, "num_layers": 2},
    "vocos.head.init_args": {"dim": 32},
}
ASSET_FILES = {
    "vocos_ckpt_path": "Vocos.safetensors", "dvae_ckpt_path": "DVAE.safetensors", "gpt_ckpt_path": "gpt",
    "embed_path": "Embed.safetensors", "decoder_ckpt_path": "Decoder.safetensors", "tokenizer_path": "tokenizer",
}


def with_fields(obj: Any, path: list[str], fields: dict[str, Any]) -> Any:
    """A copy of dataclass `obj` whose sub-dataclass at `path` has `fields` replaced (shared defaults untouched)."""
    if not path:
        return dataclasses.replace(obj, **fields)
    head, *rest = path
    return dataclasses.replace(obj, **{head: with_fields(getattr(obj, head), rest, fields)})


def shrink_config(config: Any, overrides: dict[str, dict[str, Any]]) -> None:
    """Apply dotted-path `overrides` to a reference Config instance before its modules are built."""
    for dotted, fields in overrides.items():
        head, *rest = dotted.split(".")
        setattr(config, head, with_fields(getattr(config, head), rest, fields))


def asset_dir(root: str) -> Path:
    base = Path(root)
    return base / "asset" if (base / "asset" / "gpt").is_dir() else base


class TopGapRecorder:
    """A trailing logits processor that records top-1 ids and top-2 gaps of every sampling step."""

    def __init__(self) -> None:
        self.gaps: list[torch.Tensor] = []
        self.top1: list[torch.Tensor] = []
        self.temperature = torch.ones(1)
        self.eos, self.min_new_token = 0, 0

    def reset(self, temperature: torch.Tensor, batch: int, eos: int, min_new_token: int) -> None:
        self.gaps, self.top1 = [], []
        self.temperature = temperature.float().unsqueeze(0).expand(batch, -1).reshape(-1, 1)  # [rows, 1]
        self.eos, self.min_new_token = int(eos), int(min_new_token)

    def __call__(self, history: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        masked = scores.clone()  # [rows, V]
        if len(self.gaps) < self.min_new_token:
            masked[:, self.eos] = -torch.inf
        best = masked.topk(2, dim=-1)
        self.gaps.append((best.values[:, 0] - best.values[:, 1]) * self.temperature[:, 0])
        self.top1.append(best.indices[:, 0])
        return scores


def hook_generate(chat: Any, recorder: TopGapRecorder) -> None:
    """Wrap chat.gpt.generate (also its ensure_non_empty restart) so the recorder runs last each step."""
    original = chat.gpt.generate
    signature = inspect.signature(original)

    def generate(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = bound.arguments
        recorder.reset(call["temperature"], call["inputs_ids"].shape[0], call["eos_token"], call["min_new_token"])
        if recorder not in call["logits_processors"]:
            call["logits_processors"] = (*call["logits_processors"], recorder)
        return original(**call)

    chat.gpt.generate = generate


class Runner:
    """Holds the lazily loaded reference objects and executes tasks."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.root = asset_dir(request.get("asset_root") or ".")
        self.size = request.get("size", "full")
        self._chat: Any = None
        self._tokenizer: Any = None
        self.recorder = TopGapRecorder()

    @property
    def chat(self) -> Any:
        if self._chat is None:
            import ChatTTS

            chat = ChatTTS.Chat(logging.getLogger("ref_runner"))
            if self.size == "tiny":
                shrink_config(chat.config, TINY_OVERRIDES)
            paths = {key: str(self.root / name) for key, name in ASSET_FILES.items()}
            if not chat._load(device=torch.device("cpu"), compile=False, **paths):
                raise RuntimeError(f"reference Chat._load failed for {self.root}")
            hook_generate(chat, self.recorder)
            self._chat = chat
        return self._chat

    @property
    def tokenizer(self) -> Any:
        if self._chat is not None:
            return self._chat.tokenizer
        if self._tokenizer is None:
            from ChatTTS.model import Tokenizer

            self._tokenizer = Tokenizer(str(self.root / "tokenizer"))
        return self._tokenizer

    def recorded(self, per_row: int) -> dict[str, np.ndarray]:
        if not self.recorder.gaps:
            return {}
        gaps = torch.stack(self.recorder.gaps).numpy()  # [S, rows]
        top1 = torch.stack(self.recorder.top1).numpy()
        shape = (gaps.shape[0], -1, per_row) if per_row > 1 else gaps.shape
        return {"top2_gap": gaps.reshape(shape), "top1": top1.reshape(shape)}

    def generate(self, task: dict[str, Any], per_row: int, call: Callable[[], Any]) -> tuple[dict[str, Any], Any]:
        """Run call() (one reference generation) under task's torch_seed; record its prompt and logit gaps."""
        tokenizer, captured = self.chat.tokenizer, {}
        original = tokenizer.encode

        def encode(*args: Any, **kwargs: Any) -> Any:
            ids, mask, text_mask = original(*args, **kwargs)
            captured.update(prompt_ids=ids.clone(), prompt_mask=mask.clone())
            return ids, mask, text_mask

        tokenizer.encode = encode
        if task.get("torch_seed") is not None:
            torch.manual_seed(int(task["torch_seed"]))
        try:
            result = call()
        except StopIteration:  # generate yields nothing when a seeded run hits EOS at step 0
            result = None
        finally:
            tokenizer.encode = original
        return {**captured, "yielded": result is not None, **self.recorded(per_row)}, result


def task_infer_code(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    chat = run.chat
    params = chat.InferCodeParams(**{"show_tqdm": False, **task.get("params", {})})
    out, result = run.generate(task, chat.config.gpt.num_vq,
                               lambda: next(chat._infer_code(list(task["texts"]), False, chat.device, True, params)))
    if result is None:
        return out
    out.update(codes=[ids.clone() for ids in result.ids], hidden=[h.clone() for h in result.hiddens])
    for name in task.get("decode", ["decoder", "dvae"]):
        module, rows = (chat.decoder, out["hidden"]) if name == "decoder" else (chat.dvae, out["codes"])
        mels: list[torch.Tensor] = []
        handle = module.register_forward_hook(lambda _m, _i, mel, mels=mels: mels.append(mel.clone()))
        try:  # _decode_to_wavs empties the list it is given: hand it copies
            out[f"wav_{name}"] = chat._decode_to_wavs([r.clone() for r in rows], name == "decoder")
        finally:
            handle.remove()
        out[f"mel_{name}"] = mels[0]
    return out


def task_refine_text(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    chat = run.chat
    params = chat.RefineTextParams(**{"show_tqdm": False, **task.get("params", {})})
    out, result = run.generate(task, 1, lambda: chat._refine_text(list(task["texts"]), chat.device, params))
    if result is None:
        return out
    ids = [i.clone() for i in result.ids]
    filtered = [i[i.less(chat.tokenizer.break_0_ids)] for i in ids]
    out.update(ids=ids, filtered=filtered, text=np.array(chat.tokenizer.decode(filtered), dtype=np.str_))
    return out


def task_sample_audio_speaker(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    wav = np.asarray(task["wav"], dtype=np.float32)
    spk_smp = run.chat.sample_audio_speaker(wav)
    return {"spk_smp": np.array(spk_smp, dtype=np.str_), "codes": run.chat.speaker.decode_prompt(spk_smp)}


def build_vocos(path: str) -> Any:
    """The reference's own Vocos construction (ChatTTS Config section + vocos package), sized from the file."""
    from ChatTTS.config import Config
    from ChatTTS.utils import load_safetensors
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    state = load_safetensors(path)
    dim = state["backbone.embed.weight"].shape[0]
    layers = len({k.split(".")[2] for k in state if k.startswith("backbone.convnext.")})
    config = Config()
    shrink_config(config, {
        "vocos.backbone.init_args": {"dim": dim, "num_layers": layers,
                                     "intermediate_dim": state["backbone.convnext.0.pwconv1.weight"].shape[0]},
        "vocos.head.init_args": {"dim": dim}})
    parts = {name: instantiate_class(args=(), init=dataclasses.asdict(getattr(config.vocos, name)))
             for name in ("feature_extractor", "backbone", "head")}
    vocos = Vocos(**parts).eval()
    vocos.load_state_dict(state)
    return vocos


def task_vocos_decode(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    mel = torch.as_tensor(np.asarray(task["mel"], dtype=np.float32))  # [B, 100, T]
    if task.get("vocos_path"):
        with torch.inference_mode():
            return {"wav": build_vocos(task["vocos_path"]).decode(mel)}
    return {"wav": run.chat._vocos_decode(mel)}


def task_processors(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    from ChatTTS.model import gen_logits

    logits = torch.as_tensor(np.asarray(task["logits"], dtype=np.float32))  # [R, V]
    history = torch.as_tensor(np.asarray(task.get("history", np.zeros((logits.shape[0], 0))), dtype=np.int64))
    penalty = None if task.get("repetition_penalty") is None else float(task["repetition_penalty"])
    warpers, processors = gen_logits(num_code=int(task.get("num_code", logits.shape[1])), top_P=task.get("top_P"),
                                     top_K=task.get("top_K"), repetition_penalty=penalty)
    temperature = torch.as_tensor(np.asarray(task.get("temperature", 1.0), dtype=np.float32)).reshape(-1, 1)
    out = {"after_temperature": logits / temperature}
    current = out["after_temperature"].clone()
    current = processors[0](history, current) if processors else current
    out["after_penalty"] = current.clone()
    for stage, enabled in (("after_top_p", task.get("top_P") is not None),
                           ("after_top_k", task.get("top_K") is not None)):
        if enabled:
            current = warpers.pop(0)(history, current)
        out[stage] = current.clone()
    return out


def task_speaker(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    from ChatTTS.config import Config
    from ChatTTS.model import Speaker

    dim = int(task.get("dim", 768))
    speaker = Speaker(dim, task.get("spk_stat") or Config().spk_stat, torch.device("cpu"))
    out: dict[str, Any] = {}
    if task.get("seed") is not None:
        torch.manual_seed(int(task["seed"]))
        spk = speaker.sample_random()
        out.update(spk_emb_random=np.array(spk, dtype=np.str_), random_vector=speaker._decode(spk))
    if task.get("spk_emb") is not None:
        emb = torch.zeros(1, 1, dim)  # [B, L, H]: one position holding the [spk_emb] token (id 1 here)
        speaker.apply(emb, task["spk_emb"], torch.ones(1, 1, 4, dtype=torch.long), 1, torch.device("cpu"))
        out["normalized"] = emb[0, 0].clone()
    return out


def task_tokenize(run: Runner, task: dict[str, Any]) -> dict[str, Any]:
    from ChatTTS.model import Speaker

    texts, prompt = list(task["texts"]), task.get("prompt")
    extra = task.get("decorate_params", {})
    if task.get("decorate") == "code":
        texts = Speaker.decorate_code_prompts(texts, extra.get("prompt", "[speed_5]"), extra.get("txt_smp"),
                                              extra.get("spk_emb"))
    elif task.get("decorate") == "text":
        texts = Speaker.decorate_text_prompts(texts, extra.get("prompt", ""))
    if isinstance(prompt, str):
        prompt = Speaker.decode_prompt(prompt)
    elif prompt is not None:
        prompt = torch.as_tensor(np.asarray(prompt, dtype=np.int64))
    ids, mask, text_mask = run.tokenizer.encode(texts, 4, prompt=prompt)
    return {"input_ids": ids, "attention_mask": mask, "text_mask": text_mask,
            "decorated": np.array(texts, dtype=np.str_)}


TASKS: dict[str, Callable[[Runner, dict[str, Any]], dict[str, Any]]] = {
    "infer_code": task_infer_code, "refine_text": task_refine_text,
    "sample_audio_speaker": task_sample_audio_speaker, "vocos_decode": task_vocos_decode,
    "processors": task_processors, "speaker": task_speaker, "tokenize": task_tokenize,
}


def resolve_arrays(value: Any, inputs: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$array"}:
            return inputs[value["$array"]]
        return {k: resolve_arrays(v, inputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_arrays(v, inputs) for v in value]
    return value


def to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def flatten(name: str, result: dict[str, Any]) -> dict[str, np.ndarray]:
    flat: dict[str, np.ndarray] = {}
    for field, value in result.items():
        if isinstance(value, list):
            flat.update({f"{name}/{field}/{i}": to_numpy(v) for i, v in enumerate(value)})
        else:
            flat[f"{name}/{field}"] = to_numpy(value)
    return flat


def versions() -> str:
    from importlib.metadata import version

    names = ("chattts", "torch", "torchaudio", "transformers", "vocos", "vector-quantize-pytorch", "numpy")
    return json.dumps({n: version(n) for n in names})


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: ref_runner.py REQUEST.json OUT.npz", file=sys.stderr)
        return 2
    torch.set_num_threads(int(os.environ.get("CHATTTS_REF_THREADS", "1")))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    inputs = np.load(request["inputs"], allow_pickle=False) if request.get("inputs") else {}
    run = Runner(request)
    flat = {"_meta/versions": np.array(versions(), dtype=np.str_)}
    for task in resolve_arrays(request["tasks"], inputs):
        if task.get("kind") not in TASKS:
            raise ValueError(f"unknown task kind {task.get('kind')!r}; expected one of {sorted(TASKS)}")
        flat.update(flatten(task["name"], TASKS[task["kind"]](run, task)))
    np.savez(argv[2], **flat)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
