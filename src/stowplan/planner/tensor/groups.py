"""Tensor parallel inside nodes × pipeline across them: which GPUs of a node form a stage.

A node of ``G`` GPUs can run one stage on all of them (``tp = G``), or be split
into several stages on disjoint GPU groups (``G / tp`` groups of ``tp``), or be
left out.  Each group is planned as a node of its own (its share of the node's
VRAM, bandwidth and FLOPs, ``num_gpus = tp``; :class:`GpuGroup` remembers where
it came from), so every strategy plans over groups unchanged and the cost model
charges each group its all-reduces and the cheaper hop to a group of the same
node.

Steps of :func:`plan_with_groups`:

1. The engine rule says which layouts are runnable: ``generic`` any legal
   degree per node; vLLM, SGLang and TensorRT-LLM one degree for every stage;
   llama.cpp and an Accelerate ``device_map`` one GPU per stage (layer split);
   ``Constraints.tensor_parallel`` one given degree.
2. Every uniform layout (each node split into groups of the same degree) is
   planned by the strategy; the best by the workload's objective is kept.
3. Under the generic rule, nodes then change their degree one at a time while
   that improves the plan (bounded by :data:`LOCAL_SEARCH_NODES`; on one kind of node
   only for a plan more than :data:`RESPLIT_GAP` from its bound); a stage count
   held above the groups of whole nodes is then also planned on the layout of
   fewest splits (:func:`_enough_groups`).
4. The optimum over every grouping the rule allows and every pipeline of the
   groups (:mod:`stowplan.planner.tensor.exact`: exact on small fleets where some
   optimal pipeline keeps each node's stages together, a bound elsewhere:
   :func:`_solve_runs`) certifies the plan, and replaces it when its pipeline is
   faster.  The bounds come first (:data:`BOUNDS_FIRST`): the exact solve runs only
   when they leave the plan unproven.  For concurrent sequences, the stage counts
   whose bound lies below the plan (the least first, :data:`REFINED_COUNTS` of them)
   are then planned on the plan's layout (:func:`_refined`).  On fleets of several kinds of node,
   a plan far from its bound has its layout and the local search's start searched in
   full (:data:`IN_FULL_GAP`), then layouts of its nodes split another way
   (:func:`_resplit`, :data:`RESPLIT_GAP`); on fleets of one kind of node, the plan's
   own nodes alone, one of them split another way (:data:`OWN_NODES_GROUPS`), and as
   many stages as the plan's on whole nodes but one split (:func:`_whole_but_one`).
   A plan still more than :data:`EVERY_LAYOUT_GAP` above its bound, on a fleet of a few
   multi-GPU nodes, is then solved over every split of their GPUs
   (:mod:`stowplan.planner.tensor.every_layout`): exactly where every layout's groups
   are few enough, and that optimum's pipeline replaces the plan where it is faster.
5. Under an engine rule the unconstrained plan is found too, and the plan says
   how far the engine's layout is from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from stowplan.errors import Infeasible, PlanError
from stowplan.model import Metric, NodeDescriptor, Strategy
from stowplan.plan import Plan
from stowplan.planner.certify import (
    SKETCHED,
    finish,
    is_backbone,
    is_figuring,
    is_probing,
    is_sketching,
    replaced_note,
    sketching,
)
from stowplan.planner.exact.pipelines import ENUMERATION_LIMIT, Optimum
from stowplan.planner.problem import Problem
from stowplan.planner.strategies.throughput import Pipeline
from stowplan.planner.tensor.engines import (
    consecutive,
    engine_accepts,
    engine_candidates,
    engine_fit,
)
from stowplan.planner.tensor.every_layout import EVERY_LAYOUT, every_layout, least_cycle_bound
from stowplan.planner.tensor.exact import GROUPED_NODE_LIMIT, GroupedOptimum, node_signature
from stowplan.planner.tensor.joint import (
    adjacency_loses_nothing,
    joint_cycle,
    joint_optimum,
    joint_runs,
)
from stowplan.planner.tensor.layouts import (
    ENGINE_EXPORTS,
    EngineRule,
    Layout,
    Runner,
    as_pipeline,
    check_degree,
    cycle_of,
    describe_groups,
    engine_rule,
    expand,
    layout_options,
    of_plan,
    uniform_layout,
    with_fixed_degree,
)
from stowplan.planner.tensor.nodes import GroupCosts
from stowplan.planner.tiebreak import within

__all__ = [
    "LOCAL_SEARCH_NODES",
    "EngineRule",
    "Layout",
    "describe_groups",
    "engine_rule",
    "expand",
    "plan_with_groups",
    "with_fixed_degree",
]


LOCAL_SEARCH_NODES = 16
"""Step 3 runs on fleets of up to this many multi-GPU nodes (when the joint solve of
step 4 is not exact on them)."""
LOCAL_SEARCH_TRIALS = 24
"""Most plans step 3 tries."""
BOUNDS_FIRST = True
"""Step 4 computes the bounds without the exact solve first, and runs the solve only
when they do not prove the search's plan optimal (the solve could then only tie it)."""


def _value(plan: Plan, objective: Metric) -> float:
    """Lower is better: seconds per token, or minus tokens/s."""
    pred = plan.rationale.prediction
    assert pred is not None
    return pred.time_per_token_s if objective == Metric.LATENCY else -pred.tokens_per_s


_LayoutKey = tuple[tuple[str, tuple[int, ...]], ...]


def _layout_key(layout: Layout) -> _LayoutKey:
    """``layout`` as a key: its nodes' splits in node-id order."""
    return tuple(sorted(layout.items()))


def _lower(value: float, than: float) -> bool:
    """Whether ``value`` (of :func:`_value`) is lower than ``than`` by a relative 1e-9 (the
    value is negative for throughput): a plan replaces the best only on a strict gain."""
    return value < than - 1e-9 * abs(than)


def _cycle(plan: Plan) -> float:
    """The plan's cycle, seconds (what :mod:`stowplan.planner.tiebreak` compares)."""
    pred = plan.rationale.prediction
    assert pred is not None
    return pred.time_per_token_s


class _Trials:
    """The runner's plans of the layouts of one problem, each planned once (the engine's
    search and the unconstrained one share the layouts both try)."""

    def __init__(self, problem: Problem, runner: Runner) -> None:
        self.problem, self.runner = problem, runner
        self._done: dict[_LayoutKey, Plan | None] = {}
        self.first: Layout | None = None
        """The first layout planned (every node on its largest groups, or the largest
        uniform degree): the local search's start."""

    def plan(
        self, layout: Layout, beat: float = math.inf, stages: int | None = None
    ) -> Plan | None:
        """The runner's plan over ``layout``'s groups (of exactly ``stages`` stages when
        given); None when it has none, or when no pipeline of them has a cycle below
        ``beat`` (seconds; such a plan could not replace the best in hand, which changes
        only on a strict improvement)."""
        if not any(layout.values()):
            return None
        if self.first is None and stages is None:
            self.first = dict(layout)
        key = _layout_key(layout)
        if stages is not None:
            key += (("", (stages,)),)
        if key in self._done:
            return self._done[key]
        try:
            groups = expand(self.problem, layout)
            if stages is not None:
                if not groups.min_stages <= stages <= groups.max_stages:
                    return None  # the layout has too few groups for that count
                groups = replace(groups, min_stages=stages, max_stages=stages)
            if math.isfinite(beat) and least_cycle_bound(groups) > beat * (1 + 1e-9):
                return None  # not kept: a later search may beat less
            with sketching():
                got: Plan | None = self.runner(groups)
        except PlanError:
            got = None
        self._done[key] = got
        return got

    def in_full(self, layout: Layout) -> Plan | None:
        """The runner's plan over ``layout``'s groups searched in full (not sketched: the
        counts between the ladder's, and the pipelines its certificate finds), or None."""
        try:
            return self.runner(expand(self.problem, layout))
        except PlanError:
            return None


def _search(
    trials: _Trials,
    rule: EngineRule,
    objective: Metric,
    local: bool = True,
    settled: Callable[[Plan], bool] | None = None,
) -> tuple[Plan | None, Layout | None]:
    """The best plan over the uniform layouts (and, without a uniform rule, every node on
    its largest groups), then improved by :func:`_improve` when ``local`` on fleets of up
    to :data:`LOCAL_SEARCH_NODES` multi-GPU nodes, unless ``settled`` says the plan in
    hand needs no local search (it is the optimum, or close enough to its bound)."""
    problem = trials.problem
    multi = [n for n in problem.nodes if n.num_gpus > 1]
    degrees = sorted(
        {t for n in multi for opts in layout_options(problem, rule, n) for t in opts}, reverse=True
    )
    layouts: list[Layout] = []
    if not rule.uniform:
        layouts.append({n.id: opts[0] for n in multi if (opts := layout_options(problem, rule, n))})
    layouts += [uniform_layout(problem, t) for t in degrees]
    best: tuple[float, Plan, Layout] | None = None
    seen: set[_LayoutKey] = set()
    for layout in layouts:
        key = _layout_key(layout)
        if key in seen:
            continue
        seen.add(key)
        got = trials.plan(layout, math.inf if best is None else _cycle(best[1]))
        if got is not None and (best is None or _value(got, objective) < best[0]):
            best = (_value(got, objective), got, layout)
            if is_probing():
                return got, layout  # a plan exists: nothing to rank it against
    if (
        best is not None
        and local
        and not rule.uniform
        and len(multi) <= LOCAL_SEARCH_NODES
        and not (settled is not None and settled(best[1]))
    ):
        best = _improve(trials, rule, objective, best, multi, seen)
    # A held count's layout of fewest splits comes after the local search (which starts
    # from the others' best, as it did without it): the better of the two is kept.
    for layout in [] if rule.uniform else _enough_groups(problem, rule, layouts[0]):
        if _layout_key(layout) in seen:
            continue
        got = trials.plan(layout, math.inf if best is None else _cycle(best[1]))
        if got is not None and (best is None or _lower(_value(got, objective), best[0])):
            best = (_value(got, objective), got, layout)
    return (None, None) if best is None else (best[1], best[2])


def _enough_groups(problem: Problem, rule: EngineRule, largest: Layout) -> list[Layout]:
    """Where the stage count is held above the groups of ``largest`` (every multi-GPU
    node on its largest groups): those nodes split one step further, one node at a time
    (the nodes of most GPUs first), until the groups reach the count: the fewest splits
    that can run it (a uniform degree splits every node, each stage smaller).  Empty
    where the count needs no split, or every split together falls short."""
    layout = dict(largest)

    def count() -> int:
        return sum(len(layout.get(n.id, (1,))) for n in problem.nodes)

    if count() >= problem.min_stages:
        return []
    while count() < problem.min_stages:
        stepped = False
        for node in sorted(problem.nodes, key=lambda n: -n.num_gpus):
            options = layout_options(problem, rule, node)
            here = layout.get(node.id)
            if here is None or here not in options or here == options[-1]:
                continue
            layout[node.id] = options[options.index(here) + 1]
            stepped = True
            if count() >= problem.min_stages:
                break
        if not stepped:
            return []
    return [layout]


def _improve(
    trials: _Trials,
    rule: EngineRule,
    objective: Metric,
    best: tuple[float, Plan, Layout],
    multi: Sequence[NodeDescriptor],
    seen: set[_LayoutKey],
) -> tuple[float, Plan, Layout]:
    """Change one node's split at a time while that lowers the objective (at most
    :data:`LOCAL_SEARCH_TRIALS` plans; nodes alike are tried once per round).

    On fleets of more than :data:`GROUPED_NODE_LIMIT` multi-GPU nodes (a trial is a whole
    plan of the fleet), from a node's split the search goes towards larger groups and
    towards smaller ones, each way only while the last step gained: a heuristic, which on
    30 random fleets of 9–16 such nodes (``benchmarks/grouped_fleets.py``) kept every
    plan."""
    problem = trials.problem
    tried = 0
    few = len(multi) > GROUPED_NODE_LIMIT
    improved = True
    while improved:
        improved = False
        kinds: set[tuple[object, ...]] = set()
        for node in multi:
            kind = (node_signature(node), best[2].get(node.id))
            if kind in kinds:
                continue
            kinds.add(kind)
            options = layout_options(problem, rule, node)
            here = best[2].get(node.id)
            at = options.index(here) if few and here in options else None
            ways = [options] if at is None else [options[:at][::-1], options[at + 1 :]]
            for way in ways:
                for option in way:
                    layout = {**best[2], node.id: option}
                    key = _layout_key(layout)
                    if key in seen:
                        continue
                    seen.add(key)
                    tried += 1
                    if tried > LOCAL_SEARCH_TRIALS:
                        return best
                    got = trials.plan(layout, _cycle(best[1]))
                    if got is not None and _lower(_value(got, objective), best[0]):
                        best = (_value(got, objective), got, layout)
                        improved = True
                    elif at is not None:
                        break
    return best


def _solve_runs(problem: Problem, rule: EngineRule, exact_strategy: bool, adjacent: bool) -> bool:
    """Whether step 4 runs the exact joint solve: where it is affordable
    (:func:`~stowplan.planner.tensor.joint.joint_runs`) and its value is the optimum (some
    optimal pipeline keeps each node's stages together, or one node), under the exact
    strategy, or for a MoE backbone.  Elsewhere (blocks differ, or a GPU link is dearer
    than the network) the solve's value bounds nothing and its pipelines are candidates
    only: without it, the plans of the regression suites are the same but one, 0.006 %
    slower, in a third of the time (deepseek-v3 at 64 sequences on 4 x 8 H100: 460 ->
    190 ms).  A backbone's
    experts are placed after, on its stages: the solve's pipeline has given the better
    expert-parallel plan there (qwen3:30b-a3b on two 8 x H100 nodes, 1 % more tokens/s)."""
    if not joint_runs(problem, rule, exact_strategy, every_microbatch=is_figuring()):
        return False
    return exact_strategy or adjacent or len(problem.nodes) == 1 or is_backbone()


def plan_with_groups(
    problem: Problem, runner: Runner, objective: Metric, strategy: Strategy
) -> Plan:
    """``runner``'s plan over the best GPU grouping of ``problem``'s multi-GPU nodes.

    ``problem`` holds physical nodes; a fleet of single-GPU nodes is planned as it is.
    The plan's certificate is against the optimum over every grouping the engine rule
    allows (exact on small fleets, a bound beyond), and that optimum's pipeline is the
    plan when it is better than the search's.
    Raises the strategy's :class:`PlanError` when no grouping has a plan.
    """
    check_degree(problem)
    if all(n.num_gpus == 1 for n in problem.nodes):
        return runner(problem)
    rule = engine_rule(problem)
    exact_strategy = strategy is Strategy.EXACT
    adjacent = adjacency_loses_nothing(problem)
    runs = _solve_runs(problem, rule, exact_strategy, adjacent)
    trials = _Trials(problem, runner)
    # On one node every pipeline keeps the node's stages together: the joint solve (over
    # every block range) is the optimum whatever the blocks and links.
    lossless = adjacent or len(problem.nodes) == 1
    joint: list[tuple[float, bool, str, GroupedOptimum | None]] = []
    counts: dict[int, float] = {}
    """Per stage count the joint solve bounded in full, its bound."""
    coupled: dict[int, float] = {}
    """Per stage count the coupled bound raised, that bound."""
    certified = not (is_probing() or (is_sketching() and not runs))
    """Whether the plan gets a certificate (below).  A sketch beyond the exact solve gets
    none: the bound only spares its local search, and without the coupled bound, which
    would cost more than the search it spares."""

    def bound(plan_cycle: float) -> tuple[float, bool, str, GroupedOptimum | None]:
        """The optimum over every grouping, or a bound on it (computed once).  Where the
        exact solve runs, the bounds without it come first: a pipeline that meets them
        is the optimum, which the solve could only tie."""
        if not joint:
            shared: dict[tuple[int, ...] | None, GroupCosts] = {}

            def solve(exact_solve: bool) -> tuple[float, bool, str, GroupedOptimum | None]:
                if problem.constraints.batch == 1:
                    return joint_optimum(
                        problem, rule, Metric.LATENCY, exact_solve, lossless, shared
                    )
                counts.clear()
                coupled.clear()
                return joint_cycle(
                    problem, rule, exact_solve, lossless, plan_cycle, counts, coupled, certified
                )

            if runs and BOUNDS_FIRST and not exact_strategy:
                closed = solve(False)
                if closed[0] >= plan_cycle * (1 - 1e-12):
                    joint.append(closed)
                    return closed
            joint.append(solve(runs))
        return joint[0]

    alike = len({node_signature(n) for n in problem.nodes}) == 1

    def settled(p: Plan) -> bool:
        """Whether the local search over layouts may be left out for ``p``: it meets the
        bound (no layout could improve it), or on one kind of node it is within
        :data:`RESPLIT_GAP` of it (beyond, the plan's own nodes are searched again below;
        within, the certificate keeps the gap as it keeps every other)."""
        limit = bound(_cycle(p))[0]
        gap = RESPLIT_GAP if alike else 0.0
        return _cycle(p) * (1 - gap) <= limit * (1 + 1e-12)

    # The local search is needed where the joint solve is not the optimum.
    found, layout = _search(trials, rule, objective, local=not (runs and adjacent), settled=settled)
    refined: str | None = None
    if not certified and found is not None:
        # A candidate certified elsewhere: beyond the exact solve the joint bound only
        # certifies (it brings no pipeline), so it is not computed; a probe needs no
        # better pipeline than the one it found.
        value, exact, method, best = 0.0, False, SKETCHED, None
    else:
        value, exact, method, best = bound(math.inf if found is None else _cycle(found))
        if found is not None and layout is not None and counts:
            before, found = found, _refined(trials, layout, objective, found, counts, coupled)
            if found is not before:
                refined = replaced_note(
                    f"a search held to {len(found.assignments)} stages (a count whose bound "
                    "is below the plan found)",
                    f"{strategy.value} search",
                    _cycle(found),
                    _cycle(before),
                )

        def searched_in_full(option: Layout, how: str) -> bool:
            """Whether ``option``'s groups searched in full (``how``, in the note) give a
            better plan than ``found``, which it then replaces."""
            nonlocal found, refined
            whole = trials.in_full(option)
            assert found is not None
            if whole is None or not _lower(_value(whole, objective), _value(found, objective)):
                return False
            search = f"{strategy.value} search"
            refined = replaced_note(how, search, _cycle(whole), _cycle(found))
            found = whole
            return True

        def while_far(options: Sequence[Layout], how: str) -> None:
            """Each of ``options`` :func:`searched_in_full` in turn while the bound stays
            :data:`RESPLIT_GAP` below the plan."""
            for option in options:
                assert found is not None
                if value >= _cycle(found) * (1 - RESPLIT_GAP):
                    break
                searched_in_full(option, how)

        if (
            found is not None
            and layout is not None
            and not is_sketching()
            and value < _cycle(found) * (1 - IN_FULL_GAP)
            and not alike
        ):
            # The plan's groups, and the local search's start (whose sketch may have
            # missed what a full search finds), each searched in full; then, while the
            # bound stays RESPLIT_GAP below, the plan's nodes split one step either way.
            tried = [layout] if trials.first in (None, layout) else [layout, trials.first]
            at = layout
            for option in tried:
                if searched_in_full(option, "the search of its GPU groups in full"):
                    at = option
            while_far(
                _resplit(problem, rule, at, found, tried),
                "the search in full of its nodes' GPUs split another way",
            )
        elif (
            found is not None
            and layout is not None
            and not is_sketching()
            and alike
            and value < _cycle(found) * (1 - RESPLIT_GAP)
        ):
            # One kind of node: the fleet searched in full finds what the sketches find,
            # but the plan's own nodes alone, one of them split another way, are few
            # enough to be solved exactly (OWN_NODES_GROUPS planning nodes at most).
            own = _own_nodes(problem, layout, found)
            few = [
                option
                for option in _resplit(problem, rule, own, found, [own])
                if sum(map(len, option.values())) <= OWN_NODES_GROUPS
            ]
            while_far(few, "the search in full of its own nodes, one split another way")
            while_far(
                _whole_but_one(problem, rule, found, [own]),
                "the search in full of as many stages on whole nodes but one split",
            )
            # The count of least bound on whole nodes but some split (a split node's
            # stages pass over its GPUs' link, where whole nodes pay the network), held
            # to that count: each is tried unless one proves the plan optimal.
            final = _final_bounds(counts, coupled)
            star = min(final, key=lambda s: (final[s], s), default=None)
            if star is not None and value < _cycle(found) * (1 - RESPLIT_GAP):
                for splits, option in _whole_but_some(problem, rule, star):
                    if value >= _cycle(found) * (1 - 1e-12):
                        break
                    got = trials.plan(option, _cycle(found), stages=star)
                    if got is not None and _lower(_value(got, objective), _value(found, objective)):
                        refined = replaced_note(
                            f"a search held to {star} stages (the count of least bound) on "
                            f"whole nodes but {splits} split",
                            f"{strategy.value} search",
                            _cycle(got),
                            _cycle(found),
                        )
                        found = got
    every: tuple[Problem, Pipeline] | None = None
    """The least cycle's pipeline over every split of a small fleet, where it beats the
    plan (:func:`every_layout`)."""
    if (
        found is not None
        and certified
        and not is_sketching()
        and not is_backbone()
        and ENGINE_EXPORTS.get(rule.name) is None
        and value < _cycle(found) * (1 - EVERY_LAYOUT_GAP)
    ):
        solved = every_layout(problem, rule, _cycle(found))
        if solved is not None:
            if solved.value > value:
                value, method = solved.value, EVERY_LAYOUT
            exact = exact or solved.exact
            if solved.problem is not None and solved.pipeline is not None:
                every = solved.problem, solved.pipeline
    if found is None and (best is None or not best.stages):
        raise Infeasible(
            "no split of the nodes' GPUs into stages of tensor-parallel degrees the model "
            f"allows ({rule.name} rule) fits the model within the stage limits"
        )
    notes: list[str] = [] if refined is None else [refined]
    if found is None:
        assert best is not None
        vp, pipeline = as_pipeline(problem, best.stages)
        searched = None
    else:
        vp, pipeline = of_plan(problem, found)
        searched = pipeline  # the search's plan, its ties already broken
        if rule.consecutive:
            vp, pipeline = consecutive(vp, pipeline, objective)
    # The solves' pipelines, each replacing the plan where it is faster.
    solves: list[tuple[str, tuple[Problem, Pipeline]]] = []
    if found is not None and best is not None and best.stages:
        solves.append(("the joint solve over GPU groups", as_pipeline(problem, best.stages)))
    if every is not None:
        solves.append(("the exact solve over every split of the nodes' GPUs", every))
    for how, (solved_problem, solved_pipeline) in solves:
        mine = cycle_of(vp, pipeline, objective)
        theirs = cycle_of(solved_problem, solved_pipeline, objective)
        if theirs < mine * (1 - 1e-12):
            notes.append(replaced_note(how, f"{strategy.value} search", theirs, mine))
            vp, pipeline = solved_problem, solved_pipeline
    engine = ENGINE_EXPORTS.get(rule.name)
    if engine is not None:
        pipeline, changed = engine_fit(vp, pipeline, objective, engine)
        if not engine_accepts(vp, pipeline[0], engine):
            other = engine_candidates(problem, rule, objective, engine)
            if other is None:
                raise Infeasible(
                    f"no plan {rule.name} can run fits: one tensor-parallel degree for every "
                    "stage, each node's stages together"
                    + (", and every node with as many stages" if engine == "sglang" else "")
                )
            (vp, pipeline), changed = other, True
        if changed:
            exact = False  # the solve's space is wider than the engine's: a bound
            notes.append(f"stages arranged as {rule.name} ranks its nodes")
    cm = vp.cost_model()
    mine = cycle_of(vp, pipeline, objective)
    exact = exact or value >= mine * (1 - 1e-12)  # a bound the plan meets is the optimum
    value = min(value, mine)
    optimum = Optimum(objective=objective, value=value, exact=exact, method=method)
    # Ties are broken once per pipeline: again only when the search's plan was replaced.
    plan = finish(vp, cm, strategy, pipeline, optimum=optimum, break_ties=pipeline is not searched)
    notes.insert(0, f"GPU groups ({rule.name} rule): {describe_groups(plan)}")
    if rule.name != "generic" and not is_probing():
        notes += _engine_gap(trials, objective, plan)
    r = plan.rationale
    return replace(plan, rationale=replace(r, notes=(*notes, *r.notes)))


EVERY_LAYOUT_GAP = 0.01
"""Where the bound lies further below the plan than this share, a fleet of few
multi-GPU nodes is solved over every split of their GPUs (:func:`every_layout`, at most
:data:`~stowplan.planner.tensor.every_layout.EVERY_LAYOUT_LIMIT` layouts)."""

IN_FULL_GAP = 0.001
"""Where the bound lies further below the plan found than this share, its GPU groups are
planned again in full (the layouts' plans are sketched: on the ladder's stage counts,
without the pipelines a certificate finds), on fleets of more than one kind of node (on
nodes alike it found nothing better in any case measured, at 2–3× the plan's time).
Bounds tight to a fraction of a percent leave sketched plans up to 0.2 % slower than
their groups' plan in full within 0.5 % of them."""

RESPLIT_GAP = 0.01
"""Where the bound still lies further below the plan than this share after the search
in full, layouts of its nodes split another way (:func:`_resplit`) are searched in full
(each costs a whole plan's search: not for a gap the certificate already keeps within
1 %)."""

RESPLIT_TRIALS = 4
"""Most layouts :func:`_resplit` gives to be searched in full."""

OWN_NODES_GROUPS = ENUMERATION_LIMIT
"""On a fleet of one kind of node, a plan still :data:`RESPLIT_GAP` from its bound has its
own nodes alone, one split another way, searched in full while they make at most this
many GPU groups (the size the exact solves take in milliseconds)."""


def _own_nodes(problem: Problem, layout: Layout, plan: Plan) -> Layout:
    """``layout`` with every node ``plan`` does not run on left out (no groups)."""
    used = {a.node_id for a in plan.assignments}
    return {n.id: (tuple(layout.get(n.id, ())) if n.id in used else ()) for n in problem.nodes}


def _whole_but_one(
    problem: Problem, rule: EngineRule, plan: Plan, tried: Sequence[Layout]
) -> list[Layout]:
    """On a fleet of one kind of node: as many GPU groups as ``plan`` has stages, on
    whole nodes but one, split into its next smaller groups (at most
    :data:`OWN_NODES_GROUPS` groups; nodes in the order ``plan`` runs on them, then the
    fleet's), none of ``tried``."""
    if rule.uniform or not problem.nodes:
        return []
    options = layout_options(problem, rule, problem.nodes[0])
    if len(options) < 2:
        return []
    whole, split = options[0], options[1]
    stages = len(plan.assignments)
    wholes = stages - len(split)
    if len(whole) != 1 or wholes < 1 or stages > OWN_NODES_GROUPS:
        return []
    order = list(dict.fromkeys(a.node_id for a in plan.assignments))
    order += [n.id for n in problem.nodes if n.id not in order]
    if len(order) < wholes + 1:
        return []
    chosen: dict[str, tuple[int, ...]] = {node_id: whole for node_id in order[:wholes]}
    chosen[order[wholes]] = split
    option = {n.id: chosen.get(n.id, ()) for n in problem.nodes}
    seen = set(map(_layout_key, tried))
    return [] if _layout_key(option) in seen else [option]


def _whole_but_some(problem: Problem, rule: EngineRule, stages: int) -> list[tuple[int, Layout]]:
    """On a fleet of one kind of node: ``stages`` GPU groups on whole nodes but ``k``
    split into their next smaller groups, for the :data:`WHOLE_BUT_SPLITS` least ``k``
    the fleet's nodes hold (the other nodes left out), each with its ``k``; none past
    :data:`WHOLE_BUT_STAGES` stages unless the problem is held past them too."""
    if rule.uniform or not problem.nodes:
        return []
    if stages > WHOLE_BUT_STAGES >= problem.min_stages:
        return []
    options = layout_options(problem, rule, problem.nodes[0])
    if len(options) < 2 or len(options[0]) != 1:
        return []
    whole, split = options[0], options[1]
    # k split nodes and w = stages - k · |split| whole ones take w + k nodes.
    first = max(1, math.ceil((stages - len(problem.nodes)) / (len(split) - 1)))
    ids = [n.id for n in problem.nodes]
    out: list[tuple[int, Layout]] = []
    for k in range(first, first + WHOLE_BUT_SPLITS):
        wholes = stages - k * len(split)
        if wholes < 0:
            break
        chosen = {i: whole for i in ids[:wholes]} | {i: split for i in ids[wholes : wholes + k]}
        out.append((k, {i: chosen.get(i, ()) for i in ids}))
    return out


WHOLE_BUT_SPLITS = 4
"""Most layouts :func:`_whole_but_some` gives."""

WHOLE_BUT_STAGES = 16
"""Most stages :func:`_whole_but_some` lays out where the problem allows fewer: a sketch
of more costs tens of milliseconds (deepseek-v3 and kimi-k2 at 64 sequences on 64 × 8
H100, whose bounds point at 32 stages, took 45–50 ms more for 0.14 % and nothing); a
problem held past them is laid out at any count."""


def _resplit(
    problem: Problem, rule: EngineRule, layout: Layout, plan: Plan, tried: Sequence[Layout]
) -> list[Layout]:
    """Layouts one step from ``layout`` (``plan``'s): a node that ``plan`` runs on, in
    stage order, split into its next smaller groups, then its next larger (the other
    nodes as they are), those alike given once, none of ``tried``; at most
    :data:`RESPLIT_TRIALS`; none under a rule of one degree for every stage (one node's
    split changed would break it).

    A sketch plans a layout on the ladder's stage counts without the pipelines a
    certificate finds; where a full search still leaves the plan far from its bound,
    the pipeline it misses often runs a node it uses as more stages (or fewer): its
    best pipeline on that node's groups is the sketches' blind spot."""
    if rule.uniform:
        return []
    by_id = {n.id: n for n in problem.nodes}
    used = list(dict.fromkeys(a.node_id for a in plan.assignments))
    seen = set(map(_layout_key, tried))
    kinds: set[tuple[object, ...]] = set()
    out: list[Layout] = []
    for step in (1, -1):
        for node_id in used:
            node = by_id.get(node_id)
            if node is None or node.num_gpus < 2:
                continue
            options = layout_options(problem, rule, node)
            here = layout.get(node_id)
            if here not in options:
                continue
            at = options.index(here) + step
            kind = (node_signature(node), here, step)
            if not 0 <= at < len(options) or kind in kinds:
                continue
            kinds.add(kind)
            option = {**layout, node_id: options[at]}
            key = _layout_key(option)
            if key not in seen:
                seen.add(key)
                out.append(option)
    return out[:RESPLIT_TRIALS]


REFINED_COUNTS = 2
"""Most stage counts :func:`_refined` plans."""


def _refined(
    trials: _Trials,
    layout: Layout,
    objective: Metric,
    found: Plan,
    counts: dict[int, float],
    coupled: dict[int, float],
) -> Plan:
    """``found``, or a better plan of ``layout`` held to a stage count whose bound is below
    ``found``'s cycle: the least bounds first, at most :data:`REFINED_COUNTS` counts by
    the joint bounds ``counts`` and as many more by those the coupled bound ``coupled``
    raised.

    The search plans the stage counts of least quick bound; the joint bounds are sharper
    and may point at a count it left out, which only a plan of that count can settle."""
    best = found
    final = _final_bounds(counts, coupled)
    order = sorted(counts, key=lambda s: (counts[s], s))[:REFINED_COUNTS]
    if coupled:
        by_final = sorted(final, key=lambda s: (final[s], s))
        order += [s for s in by_final if s not in order][:REFINED_COUNTS]
    for s in order:
        if final[s] >= _cycle(best) * (1 - 1e-9) or s == len(best.assignments):
            continue
        got = trials.plan(layout, _cycle(best), stages=s)
        if got is not None and _lower(_value(got, objective), _value(best, objective)):
            best = got
    return best


def _final_bounds(counts: dict[int, float], coupled: dict[int, float]) -> dict[int, float]:
    """Per stage count the joint solve bounded in full (``counts``), its bound, raised
    where the coupled bound (``coupled``) raised it."""
    return {s: max(b, coupled.get(s, b)) for s, b in counts.items()}


def _engine_gap(trials: _Trials, objective: Metric, plan: Plan) -> list[str]:
    """How far the engine's plan is from the best per-stage layout."""
    problem = trials.problem
    free, _ = _search(trials, EngineRule("generic", None, False), objective)
    if free is None:
        return []
    mine, other = _value(plan, objective), _value(free, objective)
    name = engine_rule(problem).name
    if other >= mine or within(_cycle(plan), _cycle(free)):
        return [f"{name}-expressible and as fast as any per-stage layout found"]
    if objective == Metric.LATENCY:
        return [f"{name}-expressible: {mine / other - 1:.1%} slower than the best per-stage plan"]
    return [
        f"{name}-expressible: {1 - mine / other:.1%} less throughput than the best per-stage plan"
    ]
