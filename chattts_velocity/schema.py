"""Hand-off types between the stages: text/ -> engine/ -> audio/.

One dataclass per arrow of the data-flow picture (docs/architecture.md). Every stage may
import this module; it imports nothing from the package.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeGuard, TypeVar

import torch

# The default caps on generated steps per sentence piece (upstream's): every default of a code-pass cap is
# MAX_NEW_TOKEN itself (the CLI, the server, the page, SamplingParams), every refine-pass one REFINE_MAX_NEW_TOKEN.
MAX_NEW_TOKEN = 2048  # the audio-code pass (InferCodeParams)
REFINE_MAX_NEW_TOKEN = 384  # the refine-text pass (RefineTextParams)
CODE_PROMPT = "[speed_5]"  # upstream's default control prompt of the code pass

# A custom logits processor sees the request's generated history and the logits of its rows.
#   history: [G, num_rows] int64 (generated tokens so far, prompt excluded)
#   logits:  [num_rows, V] float32 (already temperature-scaled)
# and returns logits of the same shape (may modify in place).
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

Mode = Literal["code", "text"]
T = TypeVar("T")


@dataclass
class Prompt:
    """One request's prompt as the GPT sees it (no padding; positions start at 0)."""

    input_ids: torch.Tensor  # [T, num_vq] int64; text ids repeated over the 4 channels, audio-prompt codes as is
    text_mask: torch.Tensor  # [T] bool; True -> emb_text(ids[:, 0]); False -> sum_q emb_code[q](ids[:, q])
    spk_emb: torch.Tensor | None = None  # [H] float32, already normalised; replaces the rows at spk_positions
    spk_positions: tuple[int, ...] = ()  # rows holding the [spk_emb] token

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2 or self.text_mask.shape != self.input_ids.shape[:1]:
            raise ValueError(
                f"Prompt: input_ids must be [T, num_vq] and text_mask [T], got "
                f"{tuple(self.input_ids.shape)} and {tuple(self.text_mask.shape)}"
            )
        if self.input_ids.shape[0] == 0:
            raise ValueError("Prompt: input_ids is empty; a prompt needs at least one position")

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class SamplingParams:
    """Per-request sampling settings; every request keeps its own (never 'the first request's')."""

    mode: Mode = "code"
    temperature: float | tuple[float, ...] = 0.3  # scalar, or one value per codebook row
    top_p: float | None = 0.7
    top_k: int | None = 20
    repetition_penalty: float = 1.05
    penalty_window: int = 16  # generated tokens seen by the penalty (prompt excluded)
    max_new_token: int = MAX_NEW_TOKEN
    min_new_token: int = 0
    seed: int | None = None
    eos_token_id: int = 625  # code mode: 625 in any of the 4 rows; text mode: [Ebreak] = 21136
    logits_processors: tuple[LogitsProcessor, ...] = ()
    return_hidden: bool = True
    ensure_non_empty: bool = True  # unseeded: an EOS at the very first step is retried, MAX_REGENERATE times
    priority: int = 0  # lower runs first when the scheduler uses priority order
    beam_width: int = 1  # > 1: deterministic beam search (text mode only; engine/beams/search.py), 1: sampling
    length_penalty: float = 1.0  # beam hypotheses rank by logprob_sum / length**length_penalty

    def __post_init__(self) -> None:
        check_sampling({name: getattr(self, name) for name in SAMPLING_RULES})
        if self.mode not in ("code", "text"):
            raise ValueError(f"mode: must be 'code' or 'text', got {self.mode!r}")
        if self.beam_width > 1 and self.mode != "text":
            raise ValueError(f"beam_width: beam search is for the text pass (mode 'text'); the audio-code pass "
                             f"samples its codebooks, got beam_width={self.beam_width} with mode {self.mode!r}")
        if self.beam_width > 1 and self.return_hidden:
            raise ValueError("beam_width: beam search returns no hidden states; pass return_hidden=False")

    def temperatures(self, num_rows: int) -> list[float]:
        """The temperature of each of the request's rows (4 codebooks, or 1 in text mode)."""
        if isinstance(self.temperature, (tuple, list)):
            if len(self.temperature) == 1:
                return [float(self.temperature[0])] * num_rows
            if len(self.temperature) != num_rows:
                raise ValueError(
                    f"temperature: expected 1 or {num_rows} values, got {len(self.temperature)}"
                )
            return [float(t) for t in self.temperature]
        return [float(self.temperature)] * num_rows


MAX_REGENERATE = 3  # retries of an unseeded request whose first token is EOS (upstream retries forever)
SEED_MAX = 2**63 - 1  # torch.manual_seed and the counter-based sampler both take seeds in [0, 2**63)
BEAM_WIDTH_MAX = 1024  # each beam is a running sequence: a bound on what one request may hold
TOP_K_MAX = 2**31 - 1  # larger k are clamped to the vocabulary at use anyway; this bound keeps int64 safe
# logits / temperature must stay finite in float32 (max 3.4e38): logits are far below 1e8, so 1e-30
# leaves room; 1e-6 is the usual near-greedy value.
MIN_TEMPERATURE = 1e-30


def _real(x: object) -> TypeGuard[float]:  # any finite real number (int, float, numpy scalars), not a bool
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _integer(x: object) -> TypeGuard[int]:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _temperature_ok(value: object) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return len(values) > 0 and all(_real(t) and t >= MIN_TEMPERATURE for t in values)


# SamplingParams' name -> (accepts the value?, the rule, said in the error message)
SAMPLING_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    "temperature": (_temperature_ok, f"every value must be a finite number >= {MIN_TEMPERATURE:g} "
                                     "(1e-6 is near-greedy)"),
    "top_p": (lambda v: v is None or (_real(v) and 0 < v <= 1), "must be a number in (0, 1] or None"),
    "top_k": (lambda v: v is None or (_integer(v) and 1 <= v <= TOP_K_MAX),
              "must be an integer in [1, 2**31) or None"),
    "repetition_penalty": (lambda v: _real(v) and v > 0, "must be a finite number > 0"),
    "penalty_window": (lambda v: _integer(v) and v >= 0, "must be an integer >= 0"),
    "max_new_token": (lambda v: _integer(v) and v >= 1, "must be an integer >= 1"),
    "min_new_token": (lambda v: _integer(v) and v >= 0, "must be an integer >= 0"),
    "seed": (lambda v: v is None or (_integer(v) and 0 <= v <= SEED_MAX),
             "must be an integer in [0, 2**63 - 1] or None"),
    "beam_width": (lambda v: _integer(v) and 1 <= v <= BEAM_WIDTH_MAX, f"must be an integer in [1, {BEAM_WIDTH_MAX}]"),
    "length_penalty": (_real, "must be a finite number"),
}


def check_sampling(values: Mapping[str, object], spelled: Mapping[str, str] | None = None) -> None:
    """The one check of sampling parameters, for every entry point (params, SamplingParams, server, export).

    values: keyed by SamplingParams' names (SAMPLING_RULES); absent keys are not checked.
    spelled: SamplingParams' name -> the caller's (e.g. "top_p" -> "top_P"), so a bad value raises
    ValueError("<the caller's name>: <the rule>, got <value>").
    """
    spelled = spelled or {}
    for name, value in values.items():
        accepts, rule = SAMPLING_RULES[name]
        if not accepts(value):
            raise ValueError(f"{spelled.get(name, name)}: {rule}, got {value!r}")
    low, high = values.get("min_new_token"), values.get("max_new_token")
    if _integer(low) and _integer(high) and low > high:  # both checked above when given
        raise ValueError(f"{spelled.get('min_new_token', 'min_new_token')}: must be <= "
                         f"{spelled.get('max_new_token', 'max_new_token')} ({high}), got {low}")


def check_prompt_fits(prompt_positions: int, max_new_token: int, limit: int, limit_name: str) -> None:
    """The one "prompt fits" rule, for both engines: a prompt and every step it may generate need
    prompt_positions + max_new_token positions, at most `limit` (the engine's max_model_len, the plain loop's
    max_position_embeddings). The ValueError names max_new_token (the server reports it under `input`)."""
    positions = prompt_positions + max_new_token
    if positions > limit:
        raise ValueError(f"max_new_token: the prompt ({prompt_positions} positions) + max_new_token ({max_new_token}) "
                         f"= {positions} exceeds {limit_name} ({limit}); lower max_new_token or shorten the text")


@dataclass
class TextPieces:
    """User texts split into the sentence pieces the GPT sees; owner[k] is the text that piece k came from."""

    texts: list[str]  # [P] the pieces (normalised, or refined)
    owner: list[int]  # [P] index of each piece's text
    num_texts: int

    def replace(self, texts: list[str]) -> TextPieces:
        """The same pieces with new contents (the refine pass rewrites each piece)."""
        return TextPieces(list(texts), self.owner, self.num_texts)

    def of_text(self, i: int) -> TextPieces:
        """Text i's pieces on their own (a one-text TextPieces)."""
        texts = [t for t, owner in zip(self.texts, self.owner, strict=True) if owner == i]
        return TextPieces(texts, [0] * len(texts), 1)

    def group(self, items: list[T]) -> list[list[T]]:
        """items [P], one per piece -> one list per text, in piece order."""
        grouped: list[list[T]] = [[] for _ in range(self.num_texts)]
        for item, i in zip(items, self.owner, strict=True):
            grouped[i].append(item)
        return grouped


@dataclass
class SpeechRequests:
    """Texts as GPT requests: one Prompt and one SamplingParams per sentence piece (text -> engine)."""

    pieces: TextPieces
    prompts: list[Prompt]  # [P]
    sampling: list[SamplingParams]  # [P]


FinishReason = Literal["eos", "length", "abort", "interrupted", "error"]


@dataclass
class GenerationOutput:
    """What the GPT stage hands on: the generated tokens and the hidden states that predicted them."""

    request_id: str
    token_ids: torch.Tensor  # [T, num_rows] int64 (4 in code mode, 1 in text mode); the EOS step excluded
    hidden: torch.Tensor | None = None  # [T, H] float32; hidden[k] is the state that predicted token_ids[k]
    finished: bool = False
    finish_reason: FinishReason | None = None
    extra: dict[str, float] = field(default_factory=dict)  # stats (num_generated, beam_score, ...)
    error: Exception | None = None  # why this request failed (finish_reason "error"); the others go on

    @classmethod
    def ended(cls, request_id: str, reason: FinishReason, error: Exception | None = None) -> GenerationOutput:
        """A request's last delta when it stops without a new row (interrupted, aborted, failed)."""
        return cls(request_id, torch.zeros(0, 1, dtype=torch.int64), None, True, reason, error=error)

    @classmethod
    def failed(cls, request_id: str, error: Exception) -> GenerationOutput:
        return cls.ended(request_id, "error", error)


def raise_first_error(outputs: list[GenerationOutput]) -> list[GenerationOutput]:
    """Whole-batch callers (generate) fail as a whole: the first failed request's error is raised."""
    for output in outputs:
        if output.error is not None:
            raise output.error
    return outputs


def pad_left(prompts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's batched layout: every prompt right-aligned in a [N, L] grid.

    Returns input_ids [N, L, num_vq] int64 (pads 0), attention_mask [N, L] int64 (0 on pads only)
    and text_mask [N, L] bool (False on pads and audio-prompt rows). With upstream's shared
    voice sample this equals Tokenizer.encode of ChatTTS 0.2.5 column for column.
    """
    if not prompts:
        raise ValueError("prompts: need at least one Prompt to pad")
    num_vq = prompts[0].input_ids.shape[1]
    if any(p.input_ids.shape[1] != num_vq for p in prompts):
        raise ValueError("prompts: every Prompt must have the same number of code channels")
    width = max(len(p) for p in prompts)
    input_ids = torch.zeros(len(prompts), width, num_vq, dtype=torch.int64)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.int64)
    text_mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        start = width - len(p)
        input_ids[row, start:] = p.input_ids
        attention_mask[row, start:] = 1
        text_mask[row, start:] = p.text_mask
    return input_ids, attention_mask, text_mask
