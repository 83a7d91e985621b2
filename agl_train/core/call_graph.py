"""An attempt's calls as a graph: whose context each call's prompt continues, and the root-to-leaf paths.

The proxy records how it made each prompt (`agl.chain`, docs/spans.md): `bridged` (the parent's prompt ids + its
choice's ids + new tokens, nothing sampled re-rendered), `retry` (the parent's request again), `branched` (rendered
whole: the messages diverge from every earlier call) or `rendered` (the attempt's first call, or a backend that
cannot take token ids). The edges:

- `bridged`: the call continues the parent's choice (its prompt starts with exactly that context).
- `retry`: the same request as the parent's: it hangs where the parent hung. The repeats of one request form a
  group, in call order: those before the first one the agent followed are retries it replaced (superseded); from
  that one on they are samples beside it, each trained on its own path. With none followed, all but the last are
  superseded. A call is followed when a later call continues it (a child in the graph) or names it as the call
  it branched from. The proxy cannot tell at the repeat which it is; the whole attempt can.
- `branched`: a new root (and a `PrefixBreak` record: why the prefix was not kept; none for `row_full`, whose
  prompt is the parent's context kept whole: the parent's row had no room left).
- `rendered` as the first call: a root. Other `rendered` calls and calls without `agl.chain` (spans written before
  it) are linked as trajectory rows always were: to the previous call when the prompt starts with exactly its
  prompt + response, else a new root with a `PrefixBreak` record. So is a `bridged` or `retry` call whose parent
  is not among the trainable calls (a failed call) or whose prompt does not extend the parent's context.

The choices of a call with n > 1 are siblings: each its own node under the same parent. Every root-to-leaf path
becomes one trajectory row (`aggregate.trajectory_rows`). A node on several paths (the calls before a fork) has its
sampled tokens trained in one path only, the first that is not superseded; a superseded call is a leaf (a followed
call never is), and its path is dropped or kept last with its own sampled tokens untrained, by
`agentlightning.trace_aggregator.superseded` (last: a rollout's first row, which the rollout-level advantage reads,
trains tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .prefix_break import Detokenizer, PrefixBreak, diagnose_break, extends
from .traces import LLMCall, RolloutTrace

CHAIN_BRIDGED = "bridged"
CHAIN_RETRY = "retry"
CHAIN_BRANCHED = "branched"
CHAIN_RENDERED = "rendered"
CAUSE_FIRST_CALL = "first_call"
CAUSE_ROW_FULL = "row_full"

SUPERSEDED_DROP = "drop"
"""The paths of calls a retry replaced are left out of the rows."""
SUPERSEDED_MASK = "mask"
"""The paths of calls a retry replaced stay, after the others, with the replaced calls' sampled tokens at mask 0."""
SUPERSEDED_MODES = (SUPERSEDED_DROP, SUPERSEDED_MASK)
DEFAULT_SUPERSEDED = SUPERSEDED_DROP


@dataclass(frozen=True)
class PathStep:
    """One call on a path: its index in `RolloutTrace.calls`, and whether this path trains its sampled tokens."""

    call: int
    trained: bool


@dataclass(frozen=True)
class Path:
    """A root-to-leaf path of the call graph: one trajectory row. `superseded` when it runs through a replaced call."""

    steps: tuple[PathStep, ...]
    superseded: bool = False


@dataclass(frozen=True)
class CallGraph:
    """The paths of an attempt (roots in call order, children depth first) and the prefix breaks found."""

    paths: list[Path]
    breaks: list[PrefixBreak] = field(default_factory=list)


@dataclass
class _Node:
    index: int
    call: LLMCall
    children: list[_Node] = field(default_factory=list)
    superseded: bool = False


def check_superseded(mode: str) -> str:
    """`mode` if it is one of `SUPERSEDED_MODES`; else a ValueError naming the setting."""
    if mode not in SUPERSEDED_MODES:
        raise ValueError(
            f"agentlightning.trace_aggregator.superseded must be one of {list(SUPERSEDED_MODES)}, got {mode!r}"
        )
    return mode


def continues(call: LLMCall, previous: LLMCall) -> bool:
    """Whether `call`'s prompt starts with exactly `previous`'s prompt + response.

    A compact read says so without comparing (`LLMCall.extends` names `previous`'s whole context).
    """
    if call.extends is not None and call.extends == (
        previous.span_id,
        previous.choice_position,
        len(previous.prompt_ids) + len(previous.response_ids),
    ):
        return True
    return extends(call.prompt_ids, previous.prompt_ids, previous.response_ids)


def _same_prompt(call: LLMCall, other: LLMCall) -> bool:
    """Whether the two calls sent the same prompt ids (what a retry reuses)."""
    return len(call.prompt_ids) == len(other.prompt_ids) and extends(call.prompt_ids, other.prompt_ids, ())


def _groups(nodes: Sequence[_Node]) -> list[list[_Node]]:
    """The nodes of one span together (the choices of an n > 1 call); a call without a span id alone."""
    groups: list[list[_Node]] = []
    for node in nodes:
        if groups and node.call.span_id and node.call.span_id == groups[-1][0].call.span_id:
            groups[-1].append(node)
        else:
            groups.append([node])
    return groups


class _Linker:
    """Hangs each call's nodes under their parent node (or makes them roots), in call order."""

    def __init__(self, trace: RolloutTrace, tokenizer: Detokenizer | None) -> None:
        self.trace = trace
        self.tokenizer = tokenizer
        self.nodes = [_Node(i, call) for i, call in enumerate(trace.calls)]
        self.by_span: dict[str, list[_Node]] = {}
        self.parent: dict[int, _Node | None] = {}
        self.roots: list[_Node] = []
        self.breaks: list[PrefixBreak] = []
        self.repeats: dict[str, list[str]] = {}
        """Per group of repeats of one request (keyed by its first call's span id), their span ids in call order."""
        self.group_of: dict[str, str] = {}
        self.followed: set[str] = set()
        """The span ids later calls name as the call they continue or branched from."""

    def link(self) -> list[_Node]:
        previous: _Node | None = None
        for group in _groups(self.nodes):
            first = group[0]
            parent, is_root_break = self._parent_of(first, previous)
            if is_root_break and previous is not None:
                self._record_break(first, self._branched_from(first) or previous)
            for node in group:
                self.parent[node.index] = parent
                (parent.children if parent is not None else self.roots).append(node)
            if first.call.span_id:
                self.by_span[first.call.span_id] = group
            chain = first.call.chain
            if chain is not None and chain.parent and chain.prompt != CHAIN_RETRY:
                self.followed.add(chain.parent)
            previous = group[-1]
        self._supersede()
        return self.roots

    def _supersede(self) -> None:
        """Mark the repeats the agent replaced: in each group, those before the first followed one
        (all but the last when none was followed)."""
        for spans in self.repeats.values():
            followed = [i for i, span_id in enumerate(spans) if self._was_followed(span_id)]
            for span_id in spans[: followed[0] if followed else -1]:
                for node in self.by_span[span_id]:
                    node.superseded = True

    def _was_followed(self, span_id: str) -> bool:
        return span_id in self.followed or any(node.children for node in self.by_span[span_id])

    def _parent_of(self, node: _Node, previous: _Node | None) -> tuple[_Node | None, bool]:
        """(parent node or None for a root, whether a root here is a broken prefix worth a record)."""
        chain = node.call.chain
        if chain is not None and chain.prompt == CHAIN_BRIDGED:
            parent = self._choice_node(chain.parent, chain.choice)
            if parent is not None and continues(node.call, parent.call):
                return parent, False
        elif chain is not None and chain.prompt == CHAIN_RETRY:
            replaced = self.by_span.get(chain.parent or "")
            if replaced and node.call.span_id and _same_prompt(node.call, replaced[0].call):
                twin = replaced[0].call.span_id
                first = self.group_of.setdefault(twin, twin)
                self.group_of[node.call.span_id] = first
                self.repeats.setdefault(first, [first]).append(node.call.span_id)
                return self.parent[replaced[0].index], False
        elif chain is not None and chain.prompt == CHAIN_BRANCHED:
            return None, chain.cause != CAUSE_ROW_FULL
        elif chain is not None and chain.prompt == CHAIN_RENDERED and chain.cause == CAUSE_FIRST_CALL:
            return None, False
        # No chain, rendered by a backend that takes no ids, or a chain that does not hold: the linear rule.
        if previous is not None and continues(node.call, previous.call):
            return previous, False
        return None, True

    def _choice_node(self, span_id: str | None, choice: int | None) -> _Node | None:
        group = self.by_span.get(span_id or "")
        if not group:
            return None
        for node in group:
            if node.call.choice_index == choice:
                return node
        return group[0] if choice is None and len(group) == 1 else None

    def _branched_from(self, node: _Node) -> _Node | None:
        chain = node.call.chain
        if chain is None or chain.prompt != CHAIN_BRANCHED:
            return None
        group = self.by_span.get(chain.parent or "")
        return group[-1] if group else None

    def _record_break(self, node: _Node, against: _Node) -> None:
        before = against.call
        self.breaks.append(
            diagnose_break(
                self.trace.rollout_id,
                node.index,
                before.prompt_ids,
                before.response_ids,
                node.call.prompt_ids,
                self.tokenizer,
            )
        )


def _paths(roots: Sequence[_Node]) -> list[tuple[list[_Node], bool]]:
    """Root-to-leaf node lists, depth first, each with whether it runs through a superseded node."""
    found: list[tuple[list[_Node], bool]] = []
    stack: list[tuple[_Node, list[_Node], bool]] = [(root, [], False) for root in reversed(roots)]
    while stack:
        node, above, superseded = stack.pop()
        path = [*above, node]
        superseded = superseded or node.superseded
        if not node.children:
            found.append((path, superseded))
        stack.extend((child, path, superseded) for child in reversed(node.children))
    return found


def call_graph(
    trace: RolloutTrace, tokenizer: Detokenizer | None = None, superseded: str = DEFAULT_SUPERSEDED
) -> CallGraph:
    """The paths of `trace`'s calls, with which path trains which call, and the prefix breaks.

    A call's sampled tokens are trained in the first path (depth first) that holds it and is not superseded;
    in no path when every path holding it is superseded.
    """
    check_superseded(superseded)
    linker = _Linker(trace, tokenizer)
    paths = _paths(linker.link())
    if superseded == SUPERSEDED_DROP:
        paths = [(nodes, False) for nodes, through_superseded in paths if not through_superseded]
    else:
        # Kept last: each rollout's first row then trains tokens (the rollout-level advantage reads it).
        paths.sort(key=lambda path: path[1])
    owner: dict[int, int] = {}  # call index → the path that trains it
    for number, (nodes, through_superseded) in enumerate(paths):
        for node in nodes:
            if not through_superseded and node.index not in owner:
                owner[node.index] = number
    result = [
        Path(
            steps=tuple(PathStep(node.index, owner.get(node.index) == number) for node in nodes),
            superseded=through_superseded,
        )
        for number, (nodes, through_superseded) in enumerate(paths)
    ]
    return CallGraph(paths=result, breaks=linker.breaks)
