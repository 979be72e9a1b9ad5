"""Invariants of the radix tree: lock counts, the tree's sizes, the KV its pages and rows
hold, and each holder's protected prefix as its locked path (I13-I15, I26, I27)."""
from __future__ import annotations

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.invariants_base import _req, _slot, _v, invariant


def _node_by_path(s: AbstractState) -> dict:
    return {n.path: n for n in s.nodes}


def _path_pages(nodes: dict, path: tuple):
    """Pages along the root path to the node `path`, or None if a node is missing."""
    out = []
    while path:
        n = nodes.get(path)
        if n is None:
            return None
        out[:0] = n.pages
        path = n.parent
    return tuple(out)


@invariant("I13", "lock_ref equals its live holders, never negative")
def lock_ref_holders(s: AbstractState, cfg: Config):
    nodes = _node_by_path(s)
    anchors = [(_req(r), r.anchor[1]) for r in s.reqs
               if r.locked and r.anchor and r.anchor[0] == "node"]
    anchors += [(_slot(t), t.last_node[1]) for t in s.slots if t.last_node and t.last_node[0] == "node"]
    out = []
    for name, path in anchors:
        if path not in nodes:
            out.append(_v(lock_ref_holders, f"lock anchor {list(path)} is not in the tree", name))
    for n in s.nodes:
        holders = [name for name, path in anchors if path[:len(n.path)] == n.path]
        if n.lock_ref != len(holders) or n.lock_ref < 0:
            out.append(_v(lock_ref_holders, f"lock_ref {n.lock_ref} but {len(holders)} live holder(s)"
                          f"{': ' + ', '.join(holders) if holders else ''}", f"node {list(n.path)}"))
    return out


@invariant("I14", "lock_ref(parent) >= lock_ref(child)")
def lock_ref_monotone(s: AbstractState, cfg: Config):
    nodes = _node_by_path(s)
    return [_v(lock_ref_monotone, f"lock_ref {n.lock_ref} > parent's {nodes[n.parent].lock_ref}",
               f"node {list(n.path)}")
            for n in s.nodes if n.parent in nodes and n.lock_ref > nodes[n.parent].lock_ref]


@invariant("I15", "evictable_size + protected_size match the tree's keys")
def tree_sizes(s: AbstractState, cfg: Config):
    P = s.page_size
    total = sum(len(n.pages) * P for n in s.nodes)
    locked = sum(len(n.pages) * P for n in s.nodes if n.lock_ref > 0)
    out = []
    if s.evictable_size + s.protected_size != total:
        out.append(_v(tree_sizes, f"evictable {s.evictable_size} + protected {s.protected_size} "
                      f"!= {total} tokens in the tree", "radix cache"))
    if s.protected_size != locked:
        out.append(_v(tree_sizes, f"protected_size {s.protected_size} != {locked} tokens in locked "
                      "nodes", "radix cache"))
    return out


@invariant("I26", "KV content matches the tokens it stands for")
def kv_content(s: AbstractState, cfg: Config):
    P, content, out = s.page_size, s.content_map(), []
    for n in s.nodes:
        seg = n.path[len(n.path) - len(n.pages) * P:]
        for k, p in enumerate(n.pages):
            got = content.get(p)
            want = seg[k * P:(k + 1) * P]
            if got is None or tuple(got) != tuple(want):
                out.append(_v(kv_content, f"holds KV of {got} for key tokens {want}",
                              f"node {list(n.path)}", p))
    for r in s.reqs:
        if r.row is not None:
            bad = _row_content_mismatch(r.row_pages, r.committed, r.fill_ids, content, P)
            if bad:
                i, got, p = bad
                out.append(_v(kv_content, f"row position {i} holds KV of token {got}, the request's "
                              f"token is {r.fill_ids[i]} (kv_committed_len {r.committed})", _req(r), p))
    checkpoint = {x.sid: x.checkpoint for x in s.sessions}
    for t in s.slots:
        tokens = checkpoint.get(t.sid, ())
        bad = _row_content_mismatch(t.row_pages, t.committed, tokens, content, P)
        if bad:
            i, got, p = bad
            out.append(_v(kv_content, f"row position {i} holds KV of token {got}, the session's "
                          f"token is {tokens[i]} (the slot's kv_committed_len {t.committed})",
                          _slot(t), p))
    return out


def _row_content_mismatch(row_pages, committed: int, tokens, content: dict, P: int):
    """The first row position in [0, committed) whose KV is not of its token: (position,
    the token its KV is of, page), or None. A request's row against its fill ids, a slot's
    against the session's checkpoint."""
    for i in range(min(committed, len(row_pages) * P, len(tokens))):
        p = row_pages[i // P]
        c = content.get(p)
        got = None if c is None else c[i % P]
        if got != tokens[i]:
            return i, got, p
    return None


@invariant("I27", "a row's protected prefix is the locked tree path")
def protected_prefix_is_path(s: AbstractState, cfg: Config):
    P, nodes, out = s.page_size, _node_by_path(s), []
    slots = {t.sid: t for t in s.slots}

    def check(name, h, anchor):
        if anchor is None or anchor[0] == "virtual":
            return
        path = () if anchor[0] == "root" else anchor[1]
        pages = _path_pages(nodes, path)
        if pages is None:
            out.append(_v(protected_prefix_is_path, f"anchor {list(path)} is not in the tree", name))
        elif len(pages) * P != h.protected:
            out.append(_v(protected_prefix_is_path, f"cache_protected_len {h.protected} != locked path "
                          f"length {len(pages) * P}", name))
        elif h.row is not None and tuple(h.row_pages[:len(pages)]) != pages:
            k = next(i for i, (a, b) in enumerate(zip(h.row_pages, pages)) if a != b) \
                if len(h.row_pages) >= len(pages) else len(h.row_pages)
            out.append(_v(protected_prefix_is_path, f"row-page {k} is "
                          f"{h.row_pages[k] if k < len(h.row_pages) else None}, the tree path has "
                          f"{pages[k]}", name, pages[k]))

    for r in s.reqs:
        if r.row is not None and (r.locked or r.anchor and r.anchor[0] == "virtual"):
            anchor = r.anchor
            if anchor and anchor[0] == "virtual" and anchor[1] in slots:
                anchor = slots[anchor[1]].last_node
            check(_req(r), r, anchor)
    for t in s.slots:
        check(_slot(t), t, t.last_node)
    return out
