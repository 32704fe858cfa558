//! The update of one trie: a top-down walk over the stored nodes that the sorted updates touch,
//! re-encoding and re-hashing only the nodes on changed paths, splitting the work across the
//! thread pool by nibble wherever a subtree has many pending updates.
//!
//! Nodes never move except for extensions and leaves, whose keys depend on where they hang:
//! a branch stays at its path whatever happens above it. A subtree's result goes back to its
//! parent unwritten (a branch already hashed), and the parent writes all its changed children
//! together, or merges a lone extension or leaf child into itself when deletions leave it with
//! one child.

use crate::{
    error::TrieError,
    node::{Node, StoredNode, Value, rlp_node_counted, root_hash_of},
    store::{ChildNodes, NodeStore, NodeUpdates, TrieId},
};
use alloy_primitives::B256;
use alloy_trie::{EMPTY_ROOT_HASH, Nibbles, TrieMask, nodes::RlpNode};
use overdrive_primitives::prefetch;
use rayon::prelude::*;
use std::borrow::Cow;

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
    fn get(&self, path: &Nibbles) -> Result<Option<Cow<'s, StoredNode>>, TrieError> {
        self.store.get(self.trie, path).map_err(TrieError::store)
    }

    fn get_existing(&self, path: &Nibbles) -> Result<Cow<'s, StoredNode>, TrieError> {
        self.get(path)?.ok_or(TrieError::MissingNode {
            trie: self.trie,
            path: *path,
        })
    }

    /// All children in `mask`, each required to exist.
    fn get_children(&self, path: &Nibbles, mask: TrieMask) -> Result<ChildNodes<'s>, TrieError> {
        let children = self
            .store
            .get_child_nodes(self.trie, path, mask)
            .map_err(TrieError::store)?;
        for nibble in mask.iter() {
            if !children.has(nibble) {
                return Err(TrieError::MissingNode {
                    trie: self.trie,
                    path: child_path(path, nibble),
                });
            }
        }
        Ok(children)
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
    pub(crate) fn merge(&mut self, mut other: Self) {
        self.nodes.append(&mut other.nodes);
        self.keccak_calls += other.keccak_calls;
    }

    /// The reference of `node` (a branch with the given children): its RLP, or its hash.
    fn encode(&mut self, node: &Node, children: &[RlpNode]) -> RlpNode {
        self.rlp.clear();
        node.encode(children, &mut self.rlp);
        rlp_node_counted(&self.rlp, &mut self.keccak_calls)
    }

    fn write(&mut self, path: Nibbles, node: Node, reference: RlpNode) {
        self.nodes.push_write(path, StoredNode { node, reference });
    }

    /// Encodes an extension or leaf, queues it for writing at `path`, and returns its reference.
    fn commit_short(&mut self, path: Nibbles, short: Short) -> RlpNode {
        let node = short.into_node();
        let reference = self.encode(&node, &[]);
        self.write(path, node, reference.clone());
        reference
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
        self.prepend(&single_nibble(nibble))
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
    /// Exactly as before; the parent keeps the stored reference.
    Unchanged,
    /// No node is left.
    Empty,
    /// A branch with its reference, hashed but not yet written.
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
pub(crate) fn update_trie<S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'_, S>,
    updates: &[(Nibbles, O)],
    wiped: bool,
    out: &mut Out,
) -> Result<RootChange, TrieError> {
    let root = Nibbles::new();
    let existing = if wiped { None } else { ctx.get(&root)? };
    let existed = existing.is_some();
    Ok(
        match update_node(ctx, root, existing.as_ref().map(|s| &s.node), updates, out)? {
            Sub::Unchanged => RootChange::Unchanged,
            Sub::Empty if !existed && !wiped => RootChange::Unchanged,
            Sub::Empty => {
                if existed {
                    out.delete(root);
                }
                RootChange::Changed(EMPTY_ROOT_HASH)
            }
            Sub::Branch(reference, node) => {
                let hash = root_hash_of(&reference, &mut out.keccak_calls);
                out.write(root, node, reference);
                RootChange::Changed(hash)
            }
            Sub::Short(short) => {
                let reference = out.commit_short(root, short);
                RootChange::Changed(root_hash_of(&reference, &mut out.keccak_calls))
            }
        },
    )
}

/// The hash of the trie whose root is `root`.
pub(crate) fn root_of_node(root: Option<&StoredNode>) -> B256 {
    match root {
        None => EMPTY_ROOT_HASH,
        Some(root) => root_hash_of(&root.reference, &mut 0),
    }
}

/// The value stored under `key`, found by walking from the root.
pub(crate) fn get_value<S: NodeStore>(
    ctx: &Ctx<'_, S>,
    key: &Nibbles,
) -> Result<Option<Value>, TrieError> {
    let mut path = Nibbles::new();
    loop {
        let Some(stored) = ctx.get(&path)? else {
            return Ok(None);
        };
        match &stored.node {
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
            Node::Branch { state_mask, value } => {
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

fn update_node<S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'_, S>,
    path: Nibbles,
    existing: Option<&Node>,
    updates: &[(Nibbles, O)],
    out: &mut Out,
) -> Result<Sub, TrieError> {
    if updates.is_empty() {
        return Ok(if existing.is_some() {
            Sub::Unchanged
        } else {
            Sub::Empty
        });
    }
    match existing {
        None => build_from_ops(ctx, path, updates, out),
        Some(Node::Branch { state_mask, value }) => {
            let branch = BranchIn {
                state_mask: *state_mask,
                value: value.clone(),
                virtual_child: None,
            };
            update_branch(ctx, path, branch, updates, out)
        }
        Some(Node::Extension { key, child }) => {
            update_extension(ctx, path, *key, child.clone(), updates, out)
        }
        Some(Node::Leaf { key, value }) => update_leaf(ctx, path, *key, value, updates, out),
    }
}

fn update_leaf<S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'_, S>,
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

fn update_extension<S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'_, S>,
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
    let shared = first
        .common_prefix_length(&full)
        .min(last.common_prefix_length(&full));

    if shared == full.len() {
        let child_node = ctx.get_existing(&full)?;
        return Ok(
            match update_node(ctx, full, Some(&child_node.node), updates, out)? {
                Sub::Unchanged => Sub::Unchanged,
                Sub::Empty => {
                    out.delete(full);
                    Sub::Empty
                }
                Sub::Branch(reference, node) => {
                    out.write(full, node, reference.clone());
                    Sub::Short(Short::Extension(key, reference))
                }
                Sub::Short(short) => {
                    out.delete(full);
                    Sub::Short(short.prepend(&key))
                }
            },
        );
    }

    // Some key leaves the extension part-way: treat the point where it does as a branch with
    // one child (the rest of the extension), then let the branch logic add, collapse or keep.
    let split = shared - depth;
    let at = full.slice(..shared);
    let nibble = key.get_unchecked(split);
    let rest = key.slice(split + 1..);
    let branch = if rest.is_empty() {
        // The child branch itself hangs right below the split point.
        BranchIn {
            state_mask: TrieMask::from_nibble(nibble),
            value: None,
            virtual_child: None,
        }
    } else {
        BranchIn {
            state_mask: TrieMask::default(),
            value: None,
            virtual_child: Some((nibble, Short::Extension(rest, child))),
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
            out.write(at, node, reference.clone());
            Sub::Short(Short::Extension(prefix, reference))
        }
        Sub::Short(short) => Sub::Short(short.prepend(&prefix)),
    })
}

/// A branch to update: a stored one, or one that exists only during this update because an
/// extension is being split (then its one child may not be in the store either).
struct BranchIn {
    /// The children that are in the store.
    state_mask: TrieMask,
    value: Option<Value>,
    /// A child under a nibble outside `state_mask` that is not in the store.
    virtual_child: Option<(u8, Short)>,
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
    let mut groups = Groups {
        runs: [(0, 0, 0); 16],
        len: 0,
    };
    let mut start = 0;
    while start < items.len() && groups.len < 16 {
        let nibble = items[start].0.get_unchecked(depth);
        let rest = &items[start..];
        let run = if rest.len() <= 8 {
            rest.iter()
                .take_while(|(k, _)| k.get_unchecked(depth) == nibble)
                .count()
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

fn update_branch<S: NodeStore, O: LeafOp>(
    ctx: &Ctx<'_, S>,
    path: Nibbles,
    branch: BranchIn,
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

    // Every stored child, in one lookup: the ones with updates to descend into, the others
    // for their references when this branch is re-encoded.
    let stored = ctx.get_children(&path, branch.state_mask)?;
    let groups = nibble_groups(updates, depth);
    let virtual_node = branch
        .virtual_child
        .as_ref()
        .map(|(nibble, short)| (*nibble, short.clone().into_node()));
    let existing = |nibble: u8| -> Option<&Node> {
        match &virtual_node {
            Some((n, node)) if *n == nibble => Some(node),
            _ => stored.node(nibble),
        }
    };
    // The walk below is a chain of dependent misses (a group, then a node in it, then the
    // next group): start those of all children with updates now, so that they overlap
    // instead of each waiting until the walk reaches its child. Two passes, so that the
    // nodes' loads all start before the first is waited for.
    for &(nibble, _, _) in groups.as_slice() {
        if let Some(node) = stored.node(nibble) {
            prefetch((node as *const Node).cast(), 2);
        }
    }
    for &(nibble, start, end) in groups.as_slice() {
        if let Some(Node::Branch { .. }) = stored.node(nibble) {
            // The grandchildren this child's updates descend into (all, for a long run).
            let run = &updates[start..end];
            let nibbles = if run.len() > 16 {
                TrieMask::new(u16::MAX)
            } else {
                let mut mask = TrieMask::default();
                for (key, _) in run {
                    if let Some(next) = key.get(depth + 1) {
                        mask.set_bit(next);
                    }
                }
                mask
            };
            ctx.store
                .prefetch_children(ctx.trie, &child_path(&path, nibble), nibbles);
        }
    }

    // Results of the children that have updates, by nibble.
    let mut results: [Option<Sub>; 16] = std::array::from_fn(|_| None);
    if updates.len() >= ctx.split_at && groups.len > 1 {
        let outputs: Vec<Result<(u8, Sub, Out), TrieError>> = groups
            .as_slice()
            .par_iter()
            .with_max_len(1)
            .map(|&(nibble, start, end)| {
                let mut local = Out::default();
                let sub = update_node(
                    ctx,
                    child_path(&path, nibble),
                    existing(nibble),
                    &updates[start..end],
                    &mut local,
                )?;
                Ok((nibble, sub, local))
            })
            .collect();
        for output in outputs {
            let (nibble, sub, local) = output?;
            out.merge(local);
            results[usize::from(nibble)] = Some(sub);
        }
    } else {
        for &(nibble, start, end) in groups.as_slice() {
            let sub = update_node(
                ctx,
                child_path(&path, nibble),
                existing(nibble),
                &updates[start..end],
                out,
            )?;
            results[usize::from(nibble)] = Some(sub);
        }
    }

    let virtual_nibble = virtual_node.as_ref().map(|(n, _)| *n);
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

    let count = state_mask.count_ones();
    if count >= 2 || (count == 1 && value.is_some()) {
        // Still a branch: write the changed children side by side, then encode this branch
        // over the new references and the stored ones of the untouched children.
        let mut children: [RlpNode; 16] = std::array::from_fn(|_| RlpNode::default());
        for (i, nibble) in state_mask.iter().enumerate() {
            let child = child_path(&path, nibble);
            children[i] = match results[usize::from(nibble)].take() {
                Some(Sub::Branch(reference, node)) => {
                    out.write(child, node, reference.clone());
                    reference
                }
                Some(Sub::Short(short)) => out.commit_short(child, short),
                _ => match (stored.reference(nibble), &branch.virtual_child) {
                    (Some(reference), _) => reference.clone(),
                    // The split-off rest of an extension is written now that it has a sibling.
                    (None, Some((_, short))) => out.commit_short(child, short.clone()),
                    (None, None) => {
                        return Err(TrieError::Invariant("branch child without a node"));
                    }
                },
            };
        }
        let node = Node::Branch { state_mask, value };
        let reference = out.encode(&node, &children[..count as usize]);
        return Ok(Sub::Branch(reference, node));
    }

    if count == 1 {
        // One child left and no value: this branch disappears into its child.
        let Some(nibble) = state_mask.first_set_bit_index() else {
            return Err(TrieError::Invariant("mask with one bit has no first bit"));
        };
        let child = child_path(&path, nibble);
        let was_stored = branch.state_mask.is_bit_set(nibble);
        return Ok(match results[usize::from(nibble)].take() {
            Some(Sub::Branch(reference, node)) => {
                out.write(child, node, reference.clone());
                Sub::Short(Short::Extension(single_nibble(nibble), reference))
            }
            Some(Sub::Short(short)) => {
                if was_stored {
                    out.delete(child);
                }
                Sub::Short(short.prepend_nibble(nibble))
            }
            _ => match (stored.node(nibble), &branch.virtual_child) {
                (Some(node), _) => match node {
                    Node::Branch { .. } => Sub::Short(Short::Extension(
                        single_nibble(nibble),
                        stored
                            .reference(nibble)
                            .ok_or(TrieError::Invariant("stored child without a reference"))?
                            .clone(),
                    )),
                    Node::Extension {
                        key,
                        child: grandchild,
                    } => {
                        out.delete(child);
                        Sub::Short(
                            Short::Extension(*key, grandchild.clone()).prepend_nibble(nibble),
                        )
                    }
                    Node::Leaf { key, value } => {
                        out.delete(child);
                        Sub::Short(Short::Leaf(*key, value.clone()).prepend_nibble(nibble))
                    }
                },
                (None, Some((_, short))) => Sub::Short(short.clone().prepend_nibble(nibble)),
                (None, None) => return Err(TrieError::Invariant("lone child without a node")),
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
                out.write(at, node, reference.clone());
                Ok(Sub::Short(Short::Extension(
                    first.slice(depth..shared),
                    reference,
                )))
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
    let build_child = |nibble: u8,
                       start: usize,
                       end: usize,
                       out: &mut Out|
     -> Result<(RlpNode, Node), TrieError> {
        match build_fresh(ctx, child_path(&path, nibble), &rest[start..end], out)? {
            Sub::Branch(reference, node) => Ok((reference, node)),
            Sub::Short(short) => {
                let node = short.into_node();
                Ok((out.encode(&node, &[]), node))
            }
            // A run is never empty, so neither is its subtree.
            Sub::Empty | Sub::Unchanged => {
                Err(TrieError::Invariant("empty subtree from a non-empty run"))
            }
        }
    };

    let mut children: [RlpNode; 16] = std::array::from_fn(|_| RlpNode::default());
    let mut pending: [Option<Node>; 16] = std::array::from_fn(|_| None);
    if rest.len() >= ctx.split_at && groups.len > 1 {
        let results: Vec<Result<(RlpNode, Node, Out), TrieError>> = groups
            .as_slice()
            .par_iter()
            .with_max_len(1)
            .map(|&(nibble, start, end)| {
                let mut local = Out::default();
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
    let mut state_mask = TrieMask::default();
    for (i, &(nibble, _, _)) in groups.as_slice().iter().enumerate() {
        state_mask.set_bit(nibble);
        if let Some(node) = pending[i].take() {
            out.write(child_path(&path, nibble), node, children[i].clone());
        }
    }
    let node = Node::Branch { state_mask, value };
    Ok((out.encode(&node, &children[..groups.len]), node))
}
