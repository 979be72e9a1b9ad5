"""What one exploration covers: a Config and the bounded argument domains."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from kvcheck.spec.config import Config

# ---------------------------------------------------------------------------
# the scope
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Scope:
    """What one exploration covers: a Config and the bounded argument domains."""
    cfg: Config
    sessions: int = 1                 # session ids 1..sessions
    plain: int = 1                    # plain requests live at once (0: none)
    max_live: int = 2                 # requests (turns, stubs, plain) live at once
    prompts: tuple = ((2, 3),)        # plain request prompts
    turns: tuple = ((2,),)            # new_tokens of a session turn
    max_new: tuple = (1, 2)           # max_new_tokens choices
    priorities: tuple = (0,)          # priority choices of a new request (priority scheduling)
    decode_tokens: tuple = (1,)       # Decode / SpecDecode token choices
    evict: tuple = ()                 # Evict(num_tokens) choices (() = no evict op)
    reject: bool = True               # also try Schedule(admit=False)
    rounds: bool = False              # also schedule_round / decode_round over every order
                                      # of the waiting / decoding requests (2 or more)
    progress: bool = False            # every new state must drain to idle (P1, the drain
                                      # of spec/progress.py on the spec alone)
    max_depth: int = 12
    name: str = "custom"
    out_of_reach: tuple = ()          # situation ids the scope cannot reach, by design

    def describe(self) -> str:
        c = self.cfg
        flags = [f"P={c.page_size}", f"pages={c.num_pages}", f"rows={c.num_rows}",
                 f"ctx={c.max_context_len}", f"era={c.era}"]
        if c.chunk_size is not None:
            flags.append(f"chunk={c.chunk_size}")
        if c.spec_enabled:
            flags.append(f"spec(max_drafts={c.max_drafts})")
        if c.overlap:
            flags.append("overlap")
        return (f"{self.name}: {' '.join(flags)}; sessions={self.sessions} plain={self.plain} "
                f"max_live={self.max_live} prompts={_fmt_words(self.prompts)} "
                f"turns={_fmt_words(self.turns)} max_new={list(self.max_new)} "
                f"decode_tokens={list(self.decode_tokens)} evict={list(self.evict)} "
                f"reject={self.reject}{' rounds' if self.rounds else ''}"
                f"{' progress' if self.progress else ''} "
                f"{f'priorities={list(self.priorities)} ' if self.priorities != (0,) else ''}"
                f"depth<={self.max_depth}")


def _fmt_words(ws) -> str:
    return "[" + " ".join("".join(map(str, w)) if all(t < 10 for t in w) else
                          ",".join(map(str, w)) for w in ws) + "]"


def words(alphabet, lengths) -> tuple:
    """Every token sequence over `alphabet` with a length in `lengths`."""
    return tuple(w for n in lengths for w in itertools.product(alphabet, repeat=n))
