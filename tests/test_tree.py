"""Property tests for specdec.tree: masks, depths, tries, budgets and the invariants checked on construction."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.tree import DraftTree, TreeError, ancestry

SETTINGS = settings(max_examples=100, deadline=None)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors only: extra intra-op threads just add synchronisation."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


tokens_st = st.integers(min_value=0, max_value=9)  # small vocabulary: sibling collisions are common


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 24) -> DraftTree:
    """Any valid tree: every node's parent is an earlier node."""
    num_nodes = draw(st.integers(min_value=1, max_value=max_nodes))
    parents = [-1] + [draw(st.integers(min_value=0, max_value=i - 1)) for i in range(1, num_nodes)]
    tokens = draw(st.lists(tokens_st, min_size=num_nodes, max_size=num_nodes))
    return DraftTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64))


branches_st = st.lists(st.lists(tokens_st, max_size=6), max_size=8)


def brute_ancestors(parents: list[int], node: int) -> set[int]:
    found = {node}
    while parents[node] >= 0:
        node = parents[node]
        found.add(node)
    return found


# ---------------------------------------------------------------- derived views
@SETTINGS
@given(trees())
def test_mask_is_exactly_ancestor_or_self(tree: DraftTree) -> None:
    parents = tree.parent_list
    expected = torch.zeros(tree.num_nodes, tree.num_nodes, dtype=torch.bool)
    for node in range(tree.num_nodes):
        expected[node, list(brute_ancestors(parents, node))] = True
    assert tree.ancestor_mask.dtype == torch.bool
    assert torch.equal(tree.ancestor_mask, expected)


@SETTINGS
@given(trees())
def test_depths_are_path_lengths(tree: DraftTree) -> None:
    assert tree.depths.dtype == torch.int64
    assert tree.depths.tolist() == [len(tree.path(node)) - 1 for node in range(tree.num_nodes)]
    assert tree.max_depth == max(len(path) - 1 for path in tree.paths())


@SETTINGS
@given(trees())
def test_children_paths_and_leaves_agree_with_parents(tree: DraftTree) -> None:
    parents = tree.parent_list
    for node, kids in enumerate(tree.children):
        assert kids == [i for i in range(1, tree.num_nodes) if parents[i] == node]
    assert tree.leaves == [node for node in range(tree.num_nodes) if node not in parents]
    for path in tree.paths():
        assert path[0] == 0
        assert all(parents[b] == a for a, b in zip(path, path[1:], strict=False))
        assert tree.path_tokens(path[-1]) == [tree.token_list[i] for i in path]
    # The mask row of a node marks exactly its path.
    for node in range(tree.num_nodes):
        assert tree.ancestor_mask[node].nonzero().flatten().tolist() == tree.path(node)


@SETTINGS
@given(st.integers(min_value=0, max_value=40), tokens_st)
def test_chain_mask_is_causal(num_drafts: int, root: int) -> None:
    chain = DraftTree.chain(root, list(range(num_drafts)))
    size = num_drafts + 1
    assert torch.equal(chain.ancestor_mask, torch.ones(size, size, dtype=torch.bool).tril())
    assert chain.depths.tolist() == list(range(size))
    assert chain.token_list == [root, *range(num_drafts)]


def test_chain_keeps_draft_probs() -> None:
    probs = torch.full((3, 5), 0.2)
    chain = DraftTree.chain(1, [2, 3], probs)
    assert chain.draft_probs is probs
    with pytest.raises(TreeError):
        DraftTree.chain(1, [2, 3], torch.full((2, 5), 0.2))


# ------------------------------------------------------------------ from_branches
def _node_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    return {tuple(tree.path_tokens(node)[1:]) for node in range(tree.num_nodes)}


def _no_duplicate_siblings(tree: DraftTree) -> bool:
    return all(len({tree.token_list[c] for c in kids}) == len(kids) for kids in tree.children)


@SETTINGS
@given(tokens_st, branches_st)
def test_from_branches_keeps_every_branch_and_nothing_else(root: int, branches: list[list[int]]) -> None:
    tree = DraftTree.from_branches(root, branches)
    assert tree.token_list[0] == root
    paths = _node_paths(tree)
    prefixes = {tuple(b[:k]) for b in branches for k in range(len(b) + 1)} | {()}
    assert paths == prefixes  # every prefix of every branch is a node, and every node is one
    assert len(paths) == tree.num_nodes  # ... exactly once
    assert _no_duplicate_siblings(tree)
    # Every branch that is not a prefix of another ends at a leaf.
    leaf_paths = {tuple(tree.path_tokens(leaf)[1:]) for leaf in tree.leaves}
    maximal = {tuple(b) for b in branches if not any(len(o) > len(b) and o[: len(b)] == b for o in branches)}
    assert maximal - {()} <= leaf_paths


@SETTINGS
@given(tokens_st, branches_st, st.integers(min_value=1, max_value=30))
def test_from_branches_respects_the_budget(root: int, branches: list[list[int]], max_nodes: int) -> None:
    full = DraftTree.from_branches(root, branches)
    cut = DraftTree.from_branches(root, branches, max_nodes=max_nodes)
    assert cut.num_nodes == min(max_nodes, full.num_nodes)
    # Earlier branches win: the budgeted tree is the first max_nodes nodes of the full one.
    assert cut.token_list == full.token_list[: cut.num_nodes]
    assert cut.parent_list == full.parent_list[: cut.num_nodes]
    assert _no_duplicate_siblings(cut)


def test_from_branches_rejects_a_zero_budget() -> None:
    with pytest.raises(TreeError):
        DraftTree.from_branches(1, [[2]], max_nodes=0)


@SETTINGS
@given(trees())
def test_merged_is_a_trie_with_the_same_token_paths(tree: DraftTree) -> None:
    merged = tree.merged()
    assert _no_duplicate_siblings(merged)
    assert _node_paths(merged) == _node_paths(tree)


def test_merged_refuses_trees_with_draft_probs() -> None:
    tree = DraftTree.chain(1, [2], torch.full((2, 4), 0.25))
    with pytest.raises(TreeError):
        tree.merged()


# ------------------------------------------------------------------ ancestry()
@SETTINGS
@given(trees())
def test_ancestry_matches_the_cached_views(tree: DraftTree) -> None:
    mask, depths = ancestry(tree.parents)
    assert torch.equal(mask, tree.ancestor_mask)
    assert torch.equal(depths, tree.depths)
    assert torch.equal(mask.sum(1), depths + 1)


# ------------------------------------------------------------------ invalid trees
def _t(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize(
    "tokens, parents",
    [
        pytest.param(_t([]), _t([]), id="empty"),
        pytest.param(_t([1, 2]), _t([0, 0]), id="root-parent-not-minus-one"),
        pytest.param(_t([1, 2, 3]), _t([-1, 2, 0]), id="parent-after-child"),
        pytest.param(_t([1, 2]), _t([-1, 1]), id="own-parent"),
        pytest.param(_t([1, 2]), _t([-1, -1]), id="second-root"),
        pytest.param(_t([1, 2, 3]), _t([-1, 0]), id="mismatched-lengths"),
        pytest.param(_t([1, 2], torch.int32), _t([-1, 0]), id="int32-tokens"),
        pytest.param(_t([1, 2]), torch.tensor([-1.0, 0.0]), id="float-parents"),
        pytest.param(_t([[1, 2]]), _t([[-1, 0]]), id="two-dimensional"),
    ],
)
def test_invalid_trees_raise_tree_error(tokens: torch.Tensor, parents: torch.Tensor) -> None:
    with pytest.raises(TreeError):
        DraftTree(tokens, parents)


@SETTINGS
@given(trees(max_nodes=12), st.data())
def test_any_parent_not_before_its_child_is_rejected(tree: DraftTree, data: st.DataObject) -> None:
    if tree.num_nodes < 2:
        return
    node = data.draw(st.integers(min_value=1, max_value=tree.num_nodes - 1))
    bad = data.draw(
        st.one_of(st.integers(min_value=node, max_value=node + 5), st.integers(min_value=-5, max_value=-1))
    )
    parents = tree.parents.clone()
    parents[node] = bad
    with pytest.raises(TreeError):
        DraftTree(tree.tokens, parents)


def test_draft_probs_must_have_one_row_per_node() -> None:
    with pytest.raises(TreeError):
        DraftTree(_t([1, 2]), _t([-1, 0]), torch.full((3, 4), 0.25))
    with pytest.raises(TreeError):
        DraftTree(_t([1, 2]), _t([-1, 0]), torch.full((2,), 0.5))


def test_tree_error_is_a_value_error() -> None:
    assert issubclass(TreeError, ValueError)


def test_a_chains_ancestry_is_the_walks():
    """Chains skip the level-by-level walk (a lower triangle and 0..N-1); the walk gives the same."""
    for size in (1, 2, 5):
        tree = DraftTree.chain(7, list(range(size - 1)))
        mask, depths = ancestry(tree.parents)
        assert tree.is_chain and torch.equal(tree.ancestor_mask, mask) and torch.equal(tree.depths, depths)


def test_ancestry_refuses_a_parent_after_its_child():
    with pytest.raises(ValueError, match="parent 2 must come before it"):
        ancestry(torch.tensor([-1, 2, 0]))


@SETTINGS
@given(tree=trees())
def test_a_tree_of_lists_is_the_tree_of_its_tensors(tree: DraftTree) -> None:
    made = DraftTree.of_lists(tree.tokens.tolist(), tree.parents.tolist())
    assert torch.equal(made.tokens, tree.tokens) and torch.equal(made.parents, tree.parents)
    assert made.tokens.dtype == made.parents.dtype == torch.int64
    assert made.token_list == tree.token_list and made.parent_list == tree.parent_list
    assert all(type(token) is int for token in made.token_list)
    assert torch.equal(made.ancestor_mask, tree.ancestor_mask)


def test_a_tree_of_lists_is_checked_as_any_tree() -> None:
    with pytest.raises(TreeError, match="differ in length"):
        DraftTree.of_lists([1, 2], [-1])
    with pytest.raises(TreeError, match="come before"):
        DraftTree.of_lists([1, 2, 3], [-1, 2, 0])
    with pytest.raises(TreeError, match="at least the root"):
        DraftTree.of_lists([], [])
    assert DraftTree.chain(torch.tensor(5), [torch.tensor(6)]).token_list == [5, 6]  # 0-d tensors become ints
