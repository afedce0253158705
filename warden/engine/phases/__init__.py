"""The phases of one scheduling pass (DESIGN §4), one module each, in the order they run.

`warden.engine.scheduler.Cycle.run` is the fixed sequence; every phase reads and changes one
`state.PassState` (the capacity index and quota usage, under one undo journal) and remembers
what it found in one `memo.Memo`:

1. snapshot — `state`: the engine's allocation as this pass sees it, leaving usage counted;
2. order — `order`: the ranking, claimants first;
3. admit — `admit`: assign on free capacity, backfill into reservations, or `Reserved`;
4. preempt — `preempt`: the victim search (over `victims`: what running jobs could give),
   then `claim`: signal the victims and hold the placement;
5. reserve — `reserve`: forecast where capacity frees first, and hold it;
6. explain — `walk`: walk the ranking giving every waiting job its reason (deciding the
   jobs no gate or remembered outcome answers: admit, else preempt, else reserve); `explain`:
   the plan, and the explanations worked out from what the walk left.
"""
