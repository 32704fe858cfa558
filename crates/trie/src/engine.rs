//! The update of one trie: a top-down walk over the stored nodes that the sorted updates touch,
//! re-encoding and re-hashing only the nodes on changed paths, splitting the work across the
//! thread pool by nibble wherever a subtree has many pending updates.
//!
//! Nodes never move except for extensions and leaves, whose keys depend on where they hang:
//! a branch stays at its path whatever happens above it. So a branch result is committed
//! (encoded, hashed, queued for writing) by the call that built it, while an extension or leaf
//! result goes back to the parent, which either commits it at its path or merges it into
//! itself when a deletion leaves the parent with a single child.

use crate::{
    error::TrieError,
    node::{Node, Value, child_index, rlp_node_counted, root_hash_of},
    store::{NodeStore, NodeUpdates, TrieId},
};
use alloy_primitives::B256;
use alloy_trie::{EMPTY_ROOT_HASH, Nibbles, TrieMask, nodes::RlpNode};
use rayon::prelude::*;
use std::{borrow::Cow, sync::Arc};

/// A change to one key's value, applied to the key's current value when the walk reaches it.
pub(crate) trait LeafOp: Sync {
    /// Writes the key's new value to `out` (empty on entry) and returns `true`, or returns
    /// `false` when the key is to be absent. `old` is the current value, if any.
    fn apply(&self, old: Option<&[u8]>, out: &mut Vec<u8>) -> Result<bool, TrieError>;
}

/// What one trie update reads from.
pub(crate) struct Ctx<'a, S> {
    pub store: &'a S,
    pub trie: TrieId,
    /// Subtrees with at least this many pending updates fan their children out across the
    /// pool; `usize::MAX` keeps everything on the calling thread.
    pub split_at: usize,
}

impl<'s, S: NodeStore> Ctx<'s, S> {
    fn get(&self, path: &Nibbles) -> Result<Option<Cow<'s, Node>>, TrieError> {
        self.store.get(self.trie, path).map_err(TrieError::store)
    }

    fn get_existing(&self, path: &Nibbles) -> Result<Cow<'s, Node>, TrieError> {
        self.get(path)?.ok_or(TrieError::MissingNode { trie: self.trie, path: *path })
    }
}

/// What one worker produced: node writes and deletes, its keccak count, and scratch buffers
/// reused for every node it encodes.
#[derive(Default)]
pub(crate) struct Out {
    pub nodes: NodeUpdates,
    pub keccak_calls: u64,
    rlp: Vec<u8>,
    value: Vec<u8>,
}

impl Out {
    /// An output sized for about `updates` leaf updates: each touches a leaf and shares the
    /// branches above it with its neighbours, about two written nodes per update in all.
    pub(crate) fn for_updates(updates: usize) -> Self {
        Self { nodes: NodeUpdates::with_capacity(updates * 2 + 8), ..Self::default() }
    }

    pub(crate) fn merge(&mut self, mut other: Self) {
        self.nodes.append(&mut other.nodes);
        self.keccak_calls += other.keccak_calls;
    }

    /// Encodes `node`, queues it for writing at `path`, and returns its reference.
    fn commit(&mut self, path: Nibbles, node: Node) -> RlpNode {
        let reference = self.encode(&node);
        self.nodes.push_write(path, node);
        reference
    }

    /// The reference of `node`: its RLP, or the hash of it.
    fn encode(&mut self, node: &Node) -> RlpNode {
        self.rlp.clear();
        node.encode(&mut self.rlp);
        rlp_node_counted(&self.rlp, &mut self.keccak_calls)
    }

    fn write(&mut self, path: Nibbles, node: Node) {
        self.nodes.push_write(path, node);
    }

    fn delete(&mut self, path: Nibbles) {
        self.nodes.push_delete(path);
    }
}

/// An extension or a leaf that is not yet placed.
#[derive(Clone, Debug)]
enum Short {
    Extension(Nibbles, RlpNode),
    Leaf(Nibbles, Value),
}

impl Short {
    fn prepend(self, prefix: &Nibbles) -> Self {
        match self {
            Self::Extension(key, child) => Self::Extension(prefix.join(&key), child),
            Self::Leaf(key, value) => Self::Leaf(prefix.join(&key), value),
        }
    }

    fn prepend_nibble(self, nibble: u8) -> Self {
        let mut prefix = Nibbles::new();
        prefix.push_unchecked(nibble);
        self.prepend(&prefix)
    }

    fn into_node(self) -> Node {
        match self {
            Self::Extension(key, child) => Node::Extension { key, child },
            Self::Leaf(key, value) => Node::Leaf { key, value },
        }
    }
}

/// The state of a subtree after its updates.
enum Sub {
    /// Exactly as before; the parent keeps its cached reference.
    Unchanged,
    /// No node is left.
    Empty,
    /// A branch with its reference, hashed but not yet written: the parent writes it, next to
    /// its siblings.
    Branch(RlpNode, Node),
    /// An extension or leaf for the parent to place.
    Short(Short),
}

/// How a trie's root changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RootChange {
    Unchanged,
    Changed(B256),
}

/// Applies `updates` (sorted by key, keys unique) to one trie. `wiped` starts from an empty
/// trie whatever the store holds.
pub(crate) fn update_trie<'s, S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'s, S>,
    updates: &[(Nibbles, O)],
    wiped: bool,
    out: &mut Out,
) -> Result<RootChange, TrieError> {
    let root = Nibbles::new();
    let existing = if wiped { None } else { ctx.get(&root)? };
    let existed = existing.is_some();
    Ok(match update_node(ctx, root, existing, updates, out)? {
        Sub::Unchanged => RootChange::Unchanged,
        Sub::Empty if !existed && !wiped => RootChange::Unchanged,
        Sub::Empty => {
            if existed {
                out.delete(root);
            }
            RootChange::Changed(EMPTY_ROOT_HASH)
        }
        Sub::Branch(reference, node) => {
            out.write(root, node);
            RootChange::Changed(root_hash_of(&reference, &mut out.keccak_calls))
        }
        Sub::Short(short) => {
            let reference = out.commit(root, short.into_node());
            RootChange::Changed(root_hash_of(&reference, &mut out.keccak_calls))
        }
    })
}

/// The hash of the trie whose root node is `node`.
pub(crate) fn root_of_node(node: Option<&Node>) -> B256 {
    match node {
        None => EMPTY_ROOT_HASH,
        Some(node) => alloy_primitives::keccak256(node.to_rlp()),
    }
}

/// The value stored under `key`, found by walking from the root.
pub(crate) fn get_value<S: NodeStore>(ctx: &Ctx<'_, S>, key: &Nibbles) -> Result<Option<Value>, TrieError> {
    let mut path = Nibbles::new();
    loop {
        let Some(node) = ctx.get(&path)? else { return Ok(None) };
        match &*node {
            Node::Leaf { key: rest, value } => {
                return Ok((path.join(rest) == *key).then(|| value.clone()));
            }
            Node::Extension { key: rest, .. } => {
                let next = path.join(rest);
                if !key.starts_with(&next) {
                    return Ok(None);
                }
                path = next;
            }
            Node::Branch { state_mask, value, .. } => {
                if key.len() == path.len() {
                    return Ok(value.clone());
                }
                let nibble = key.get_unchecked(path.len());
                if !state_mask.is_bit_set(nibble) {
                    return Ok(None);
                }
                path.push_unchecked(nibble);
            }
        }
    }
}

fn update_node<'s, S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'s, S>,
    path: Nibbles,
    existing: Option<Cow<'s, Node>>,
    updates: &[(Nibbles, O)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    if updates.is_empty() {
        return Ok(if existing.is_some() { Sub::Unchanged } else { Sub::Empty });
    }
    match existing.as_deref() {
        None => build_from_ops(ctx, path, updates, out),
        Some(Node::Branch { state_mask, children, value }) => {
            let branch = BranchIn { state_mask: *state_mask, children, virtual_child: None, value: value.clone() };
            update_branch(ctx, path, branch, updates, out)
        }
        Some(Node::Extension { key, child }) => update_extension(ctx, path, *key, child.clone(), updates, out),
        Some(Node::Leaf { key, value }) => update_leaf(ctx, path, *key, value, updates, out),
    }
}

fn update_leaf<'s, S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'s, S>,
    path: Nibbles,
    key: Nibbles,
    value: &Value,
    updates: &[(Nibbles, O)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    let full = path.join(&key);
    // The common case: the one update is to this leaf's own key.
    if let [(only, op)] = updates
        && *only == full
    {
        out.value.clear();
        return Ok(if !op.apply(Some(value), &mut out.value)? {
            Sub::Empty
        } else if out.value[..] == value[..] {
            Sub::Unchanged
        } else {
            Sub::Short(Short::Leaf(key, Value::new(&out.value)))
        });
    }
    // Other keys arrive next to this leaf: rebuild the subtree from the merged key set.
    let mut entries = Vec::with_capacity(updates.len() + 1);
    let mut changed = false;
    let mut seen = false;
    for (k, op) in updates {
        let old = (*k == full).then_some(&value[..]);
        seen |= old.is_some();
        out.value.clear();
        let keep = op.apply(old, &mut out.value)?;
        match (keep, old) {
            (false, None) => {}
            (false, Some(_)) => changed = true,
            (true, Some(old)) if old == &out.value[..] => entries.push((*k, value.clone())),
            (true, _) => {
                changed = true;
                entries.push((*k, Value::new(&out.value)));
            }
        }
    }
    if !changed {
        return Ok(Sub::Unchanged);
    }
    if !seen {
        let at = entries.partition_point(|(k, _)| *k < full);
        entries.insert(at, (full, value.clone()));
    }
    build_fresh(ctx, path, &entries, out)
}

fn update_extension<'s, S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'s, S>,
    path: Nibbles,
    key: Nibbles,
    child: RlpNode,
    updates: &[(Nibbles, O)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    let depth = path.len();
    let full = path.join(&key);
    // Keys sharing a prefix are contiguous in sorted order, so the shortest match with the
    // extension's path is at one of the two ends.
    let first = &updates[0].0;
    let last = &updates[updates.len() - 1].0;
    let shared = first.common_prefix_length(&full).min(last.common_prefix_length(&full));

    if shared == full.len() {
        let child_node = ctx.get_existing(&full)?;
        return Ok(match update_node(ctx, full, Some(child_node), updates, out)? {
            Sub::Unchanged => Sub::Unchanged,
            Sub::Empty => {
                out.delete(full);
                Sub::Empty
            }
            Sub::Branch(reference, node) => {
                out.write(full, node);
                Sub::Short(Short::Extension(key, reference))
            }
            Sub::Short(short) => {
                out.delete(full);
                Sub::Short(short.prepend(&key))
            }
        });
    }

    // Some key leaves the extension part-way: treat the point where it does as a branch with
    // one child (the rest of the extension), then let the branch logic add, collapse or keep.
    let split = shared - depth;
    let at = full.slice(..shared);
    let nibble = key.get_unchecked(split);
    let rest = key.slice(split + 1..);
    let only_child = [child.clone()];
    let branch = if rest.is_empty() {
        BranchIn {
            state_mask: TrieMask::from_nibble(nibble),
            children: &only_child,
            virtual_child: None,
            value: None,
        }
    } else {
        BranchIn {
            state_mask: TrieMask::default(),
            children: &[],
            virtual_child: Some((nibble, Short::Extension(rest, child))),
            value: None,
        }
    };
    let sub = update_branch(ctx, at, branch, updates, out)?;
    if split == 0 {
        return Ok(sub);
    }
    let prefix = key.slice(..split);
    Ok(match sub {
        Sub::Unchanged => Sub::Unchanged,
        Sub::Empty => Sub::Empty,
        Sub::Branch(reference, node) => {
            out.write(at, node);
            Sub::Short(Short::Extension(prefix, reference))
        }
        Sub::Short(short) => Sub::Short(short.prepend(&prefix)),
    })
}

/// A branch to update: a stored one, or one that exists only during this update because an
/// extension is being split (then its one child may not be in the store either).
struct BranchIn<'a> {
    state_mask: TrieMask,
    /// References of the children in `state_mask`, which are in the store.
    children: &'a [RlpNode],
    /// A child under a nibble outside `state_mask` that is not in the store.
    virtual_child: Option<(u8, Short)>,
    value: Option<Value>,
}

impl BranchIn<'_> {
    fn existing_child<'s, S: NodeStore>(
        &self,
        ctx: &Ctx<'s, S>,
        path: &Nibbles,
        nibble: u8,
    ) -> Result<Option<Cow<'s, Node>>, TrieError> {
        if self.state_mask.is_bit_set(nibble) {
            return ctx.get_existing(path).map(Some);
        }
        Ok(match &self.virtual_child {
            Some((n, short)) if *n == nibble => Some(Cow::Owned(short.clone().into_node())),
            _ => None,
        })
    }
}

/// Up to sixteen runs of updates, one per child nibble: (nibble, start, end).
struct Groups {
    runs: [(u8, usize, usize); 16],
    len: usize,
}

impl Groups {
    fn as_slice(&self) -> &[(u8, usize, usize)] {
        &self.runs[..self.len]
    }
}

/// Splits sorted items, all longer than `depth` and sharing the nibbles before it, into runs
/// by the nibble at `depth`; binary search keeps this cheap for large runs.
fn nibble_groups<T>(items: &[(Nibbles, T)], depth: usize) -> Groups {
    let mut groups = Groups { runs: [(0, 0, 0); 16], len: 0 };
    let mut start = 0;
    while start < items.len() && groups.len < 16 {
        let nibble = items[start].0.get_unchecked(depth);
        let rest = &items[start..];
        let run = if rest.len() <= 8 {
            rest.iter().take_while(|(k, _)| k.get_unchecked(depth) == nibble).count()
        } else {
            rest.partition_point(|(k, _)| k.get_unchecked(depth) <= nibble)
        };
        // A run is never empty; guard anyway so malformed input cannot loop forever.
        let end = start + run.max(1);
        groups.runs[groups.len] = (nibble, start, end);
        groups.len += 1;
        start = end;
    }
    groups
}

/// Asks for the cache line at `ptr` ahead of use: a branch's child references live in their
/// own allocation, whose miss would otherwise wait until the branch is re-encoded.
#[inline(always)]
fn prefetch(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint that never
        // faults, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ptr.cast());
            _mm_prefetch::<_MM_HINT_T0>(ptr.wrapping_add(64).cast());
            _mm_prefetch::<_MM_HINT_T0>(ptr.wrapping_add(128).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

fn child_path(path: &Nibbles, nibble: u8) -> Nibbles {
    let mut child = *path;
    child.push_unchecked(nibble);
    child
}

fn single_nibble(nibble: u8) -> Nibbles {
    let mut key = Nibbles::new();
    key.push_unchecked(nibble);
    key
}

fn update_branch<'s, S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'s, S>,
    path: Nibbles,
    branch: BranchIn<'_>,
    updates: &[(Nibbles, O)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    let depth = path.len();
    let mut changed = false;
    let mut value = branch.value.clone();
    let mut updates = updates;

    // A key that ends at this branch sorts before the keys that continue below it.
    if let Some(((key, op), rest)) = updates.split_first()
        && key.len() == depth
    {
        out.value.clear();
        let keep = op.apply(value.as_deref(), &mut out.value)?;
        match (keep, value.as_deref()) {
            (false, None) => {}
            (false, Some(_)) => {
                value = None;
                changed = true;
            }
            (true, Some(old)) if old == &out.value[..] => {}
            (true, _) => {
                value = Some(Value::new(&out.value));
                changed = true;
            }
        }
        updates = rest;
    }

    // Results of the children that have updates, by nibble.
    let mut results: [Option<Sub>; 16] = std::array::from_fn(|_| None);
    let groups = nibble_groups(updates, depth);
    if updates.len() >= ctx.split_at && groups.len > 1 {
        let outputs: Vec<Result<(u8, Sub, Out), TrieError>> = groups
            .as_slice()
            .par_iter()
            .with_max_len(1)
            .map(|&(nibble, start, end)| {
                let mut local = Out::for_updates(end - start);
                let child = child_path(&path, nibble);
                let existing = branch.existing_child(ctx, &child, nibble)?;
                let sub = update_node(ctx, child, existing, &updates[start..end], &mut local)?;
                Ok((nibble, sub, local))
            })
            .collect();
        for output in outputs {
            let (nibble, sub, local) = output?;
            out.merge(local);
            results[usize::from(nibble)] = Some(sub);
        }
    } else {
        // Look all children up before descending, so that their cache misses overlap.
        let mut existing: [Option<Cow<'s, Node>>; 16] = std::array::from_fn(|_| None);
        for &(nibble, _, _) in groups.as_slice() {
            let child = branch.existing_child(ctx, &child_path(&path, nibble), nibble)?;
            if let Some(node) = child.as_deref() {
                prefetch((node as *const Node).cast());
            }
            existing[usize::from(nibble)] = child;
        }
        for &(nibble, _, _) in groups.as_slice() {
            if let Some(Node::Branch { children, .. }) = existing[usize::from(nibble)].as_deref() {
                prefetch(children.as_ptr().cast());
            }
        }
        for &(nibble, start, end) in groups.as_slice() {
            let child = existing[usize::from(nibble)].take();
            let sub = update_node(ctx, child_path(&path, nibble), child, &updates[start..end], out)?;
            results[usize::from(nibble)] = Some(sub);
        }
    }

    let virtual_nibble = branch.virtual_child.as_ref().map(|(n, _)| *n);
    let mut state_mask = TrieMask::default();
    for nibble in 0..16u8 {
        let existed = branch.state_mask.is_bit_set(nibble) || virtual_nibble == Some(nibble);
        match &results[usize::from(nibble)] {
            None | Some(Sub::Unchanged) => {
                if existed {
                    state_mask.set_bit(nibble);
                }
            }
            Some(Sub::Empty) => {
                if existed {
                    changed = true;
                    if branch.state_mask.is_bit_set(nibble) {
                        out.delete(child_path(&path, nibble));
                    }
                }
            }
            Some(Sub::Branch(..) | Sub::Short(_)) => {
                changed = true;
                state_mask.set_bit(nibble);
            }
        }
    }
    if !changed {
        return Ok(Sub::Unchanged);
    }

    // The child under `nibble` that was not updated (or updated to the same thing).
    let unchanged_child = |nibble: u8| -> Option<&RlpNode> {
        branch.state_mask.is_bit_set(nibble).then(|| branch.children.get(child_index(branch.state_mask, nibble))).flatten()
    };

    let count = state_mask.count_ones();
    if count >= 2 || (count == 1 && value.is_some()) {
        let mut children: [RlpNode; 16] = std::array::from_fn(|_| RlpNode::default());
        for (i, nibble) in state_mask.iter().enumerate() {
            let child = child_path(&path, nibble);
            children[i] = match results[usize::from(nibble)].take() {
                Some(Sub::Branch(reference, node)) => {
                    out.write(child, node);
                    reference
                }
                Some(Sub::Short(short)) => out.commit(child, short.into_node()),
                _ => match unchanged_child(nibble) {
                    Some(reference) => reference.clone(),
                    // The split-off rest of an extension is written now that it has a sibling.
                    None => match &branch.virtual_child {
                        Some((_, short)) => out.commit(child, short.clone().into_node()),
                        None => return Err(TrieError::Invariant("branch child without reference")),
                    },
                },
            };
        }
        let node = Node::Branch { state_mask, children: Arc::from(&children[..count as usize]), value };
        return Ok(Sub::Branch(out.encode(&node), node));
    }

    if count == 1 {
        // One child left and no value: this branch disappears into its child.
        let Some(nibble) = state_mask.first_set_bit_index() else {
            return Err(TrieError::Invariant("mask with one bit has no first bit"));
        };
        let child = child_path(&path, nibble);
        let stored = branch.state_mask.is_bit_set(nibble);
        return Ok(match results[usize::from(nibble)].take() {
            Some(Sub::Branch(reference, node)) => {
                out.write(child, node);
                Sub::Short(Short::Extension(single_nibble(nibble), reference))
            }
            Some(Sub::Short(short)) => {
                if stored {
                    out.delete(child);
                }
                Sub::Short(short.prepend_nibble(nibble))
            }
            _ if stored => match &*ctx.get_existing(&child)? {
                Node::Branch { .. } => match unchanged_child(nibble) {
                    Some(reference) => Sub::Short(Short::Extension(single_nibble(nibble), reference.clone())),
                    None => return Err(TrieError::Invariant("stored child without reference")),
                },
                Node::Extension { key, child: grandchild } => {
                    out.delete(child);
                    Sub::Short(Short::Extension(*key, grandchild.clone()).prepend_nibble(nibble))
                }
                Node::Leaf { key, value } => {
                    out.delete(child);
                    Sub::Short(Short::Leaf(*key, value.clone()).prepend_nibble(nibble))
                }
            },
            _ => match &branch.virtual_child {
                Some((_, short)) => Sub::Short(short.clone().prepend_nibble(nibble)),
                None => return Err(TrieError::Invariant("lone child without node")),
            },
        });
    }

    Ok(match value {
        Some(value) => Sub::Short(Short::Leaf(Nibbles::new(), value)),
        None => Sub::Empty,
    })
}

/// Builds the subtree of keys that do not exist yet.
fn build_from_ops<S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'_, S>,
    path: Nibbles,
    updates: &[(Nibbles, O)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    if let [(key, op)] = updates {
        out.value.clear();
        return Ok(if op.apply(None, &mut out.value)? {
            Sub::Short(Short::Leaf(key.slice(path.len()..), Value::new(&out.value)))
        } else {
            Sub::Empty
        });
    }
    let entries: Vec<(Nibbles, Value)> = if updates.len() >= ctx.split_at.max(4096) {
        updates
            .par_iter()
            .map_init(Vec::new, |buf, (key, op)| {
                buf.clear();
                Ok(op.apply(None, buf)?.then(|| (*key, Value::new(buf))))
            })
            .filter_map(Result::transpose)
            .collect::<Result<_, TrieError>>()?
    } else {
        let mut entries = Vec::with_capacity(updates.len());
        for (key, op) in updates {
            out.value.clear();
            if op.apply(None, &mut out.value)? {
                entries.push((*key, Value::new(&out.value)));
            }
        }
        entries
    };
    build_fresh(ctx, path, &entries, out)
}

/// Builds the subtree of `entries` (sorted, unique, all under `path`) from nothing.
fn build_fresh<S: NodeStore>(
    ctx: &Ctx<'_, S>,
    path: Nibbles,
    entries: &[(Nibbles, Value)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    let depth = path.len();
    match entries {
        [] => Ok(Sub::Empty),
        [(key, value)] => Ok(Sub::Short(Short::Leaf(key.slice(depth..), value.clone()))),
        [(first, _), .., (last, _)] => {
            let shared = first.common_prefix_length(last);
            if shared > depth {
                let at = first.slice(..shared);
                let (reference, node) = build_branch(ctx, at, entries, out)?;
                out.write(at, node);
                Ok(Sub::Short(Short::Extension(first.slice(depth..shared), reference)))
            } else {
                let (reference, node) = build_branch(ctx, path, entries, out)?;
                Ok(Sub::Branch(reference, node))
            }
        }
    }
}

/// Builds the branch at `path` over at least two entries that diverge at `path` (or one of
/// which ends there): writes its subtree, and returns the branch hashed but not written.
fn build_branch<S: NodeStore>(
    ctx: &Ctx<'_, S>,
    path: Nibbles,
    entries: &[(Nibbles, Value)],
    out: &mut Out,
) -> Result<(RlpNode, Node), TrieError> {
    let depth = path.len();
    let (value, rest) = match entries.split_first() {
        Some(((key, value), rest)) if key.len() == depth => (Some(value.clone()), rest),
        _ => (None, entries),
    };
    let groups = nibble_groups(rest, depth);
    // The child's reference and its node, not yet written.
    let build_child = |nibble: u8, start: usize, end: usize, out: &mut Out| -> Result<(RlpNode, Node), TrieError> {
        match build_fresh(ctx, child_path(&path, nibble), &rest[start..end], out)? {
            Sub::Branch(reference, node) => Ok((reference, node)),
            Sub::Short(short) => {
                let node = short.into_node();
                Ok((out.encode(&node), node))
            }
            // A run is never empty, so neither is its subtree.
            Sub::Empty | Sub::Unchanged => Err(TrieError::Invariant("empty subtree from a non-empty run")),
        }
    };

    let mut state_mask = TrieMask::default();
    let mut children: [RlpNode; 16] = std::array::from_fn(|_| RlpNode::default());
    let mut pending: [Option<Node>; 16] = std::array::from_fn(|_| None);
    if rest.len() >= ctx.split_at && groups.len > 1 {
        let results: Vec<Result<(RlpNode, Node, Out), TrieError>> = groups
            .as_slice()
            .par_iter()
            .with_max_len(1)
            .map(|&(nibble, start, end)| {
                let mut local = Out::for_updates(end - start);
                let (reference, node) = build_child(nibble, start, end, &mut local)?;
                Ok((reference, node, local))
            })
            .collect();
        for (i, result) in results.into_iter().enumerate() {
            let (reference, node, local) = result?;
            out.merge(local);
            children[i] = reference;
            pending[i] = Some(node);
        }
    } else {
        for (i, &(nibble, start, end)) in groups.as_slice().iter().enumerate() {
            let (reference, node) = build_child(nibble, start, end, out)?;
            children[i] = reference;
            pending[i] = Some(node);
        }
    }
    // The children are written together, after their subtrees.
    for (i, &(nibble, _, _)) in groups.as_slice().iter().enumerate() {
        state_mask.set_bit(nibble);
        if let Some(node) = pending[i].take() {
            out.write(child_path(&path, nibble), node);
        }
    }
    let node = Node::Branch { state_mask, children: Arc::from(&children[..groups.len]), value };
    Ok((out.encode(&node), node))
}
