//! The update of one trie: a top-down walk over the stored nodes that the sorted updates touch,
//! re-encoding and re-hashing only the nodes on changed paths, splitting the work across the
//! thread pool by nibble wherever a subtree has many pending updates.
//!
//! Nodes never move except for extensions and leaves, whose keys depend on where they hang:
//! a branch stays at its path whatever happens above it, so a changed branch is written as soon
//! as it is finished. An extension or leaf goes back to its parent unplaced, and the parent
//! writes it at its path, or merges a lone extension or leaf child into itself when deletions
//! leave it with one child.
//!
//! Hashes may be taken later than the writes (see [`WorkerOutput`]): a node's reference is then
//! [`Ref::Pending`] until its trie, or the parallel task that built it, settles.

use crate::{
    error::TrieError,
    node::{Node, StoredNode, Value, rlp_node_counted, root_hash_of},
    store::{ChildNodes, NodeStore, NodeUpdates, TrieId, WriteSlot},
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
pub(crate) struct UpdateSource<'a, S> {
    pub store: &'a S,
    pub trie: TrieId,
    /// Subtrees with at least this many pending updates fan their children out across the
    /// pool; `usize::MAX` keeps everything on the calling thread.
    pub split_at: usize,
    /// Whether hashes are taken in batches (see [`WorkerOutput`]).
    pub defer: bool,
}

impl<'s, S: NodeStore> UpdateSource<'s, S> {
    fn get(&self, path: &Nibbles) -> Result<Option<Cow<'s, StoredNode>>, TrieError> {
        self.store.get(self.trie, path).map_err(TrieError::store)
    }

    fn get_existing(&self, path: &Nibbles) -> Result<Cow<'s, StoredNode>, TrieError> {
        self.get(path)?.ok_or(TrieError::MissingNode {
            trie: self.trie,
            path: *path,
        })
    }

    /// Checks that `node`, read from the store at `path`, can sit there. Walking a node that
    /// cannot would overflow a 64-nibble path (a panic, or undefined behaviour in `Nibbles`'
    /// unchecked pushes) or never end (an extension with an empty key leads to itself), so
    /// every stored node is checked before the walk goes through it or merges it upwards.
    fn check(&self, path: &Nibbles, node: &Node) -> Result<(), TrieError> {
        let reason = match node {
            Node::Leaf { key, .. } if path.len() + key.len() > 64 => {
                "leaf key runs past 64 nibbles"
            }
            Node::Extension { key, .. } if key.is_empty() => "extension with an empty key",
            // Its child is a branch, which has children one nibble further down.
            Node::Extension { key, .. } if path.len() + key.len() >= 64 => {
                "extension runs to 64 nibbles"
            }
            Node::Branch { .. } if path.len() >= 64 => "branch at 64 nibbles",
            _ => return Ok(()),
        };
        Err(self.malformed(path, reason))
    }

    fn malformed(&self, path: &Nibbles, reason: &'static str) -> TrieError {
        TrieError::MalformedNode {
            trie: self.trie,
            path: *path,
            reason,
        }
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

/// A child's reference during an update: final, or the index of a node of the same [`WorkerOutput`]
/// whose hash is taken later, together with others (see [`WorkerOutput::resolve`]).
#[derive(Clone, Debug)]
pub(crate) enum Ref {
    Known(RlpNode),
    Pending(u32),
}

impl Ref {
    fn shifted(self, offset: u32) -> Self {
        match self {
            Self::Pending(i) => Self::Pending(i + offset),
            known => known,
        }
    }
}

/// Values that hold references of a [`WorkerOutput`]'s pending nodes.
trait HasRefs {
    fn map_refs(self, f: impl FnMut(Ref) -> Ref) -> Self;
}

impl HasRefs for Ref {
    fn map_refs(self, mut f: impl FnMut(Ref) -> Ref) -> Self {
        f(self)
    }
}

/// A node written with placeholders for its hash and its pending children's hashes.
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// 0 without pending children, else one more than the highest of theirs: nodes of one
    /// height never depend on each other.
    height: u8,
    /// Its write in [`WorkerOutput::nodes`].
    write: WriteSlot,
    /// Its encoding in [`Scratch::bytes`].
    bytes: (u32, u32),
    /// Its pending children in [`Scratch::patches`].
    patches: (u32, u32),
}

/// Where a pending child's hash goes: 32 bytes at `at` in [`Scratch::bytes`].
#[derive(Clone, Copy, Debug)]
struct Patch {
    at: u32,
    child: u32,
}

/// The placeholder of a pending child in its parent's encoding: a hash's RLP of the right length.
const PLACEHOLDER_REF: RlpNode = {
    let mut raw = [0u8; 33];
    raw[0] = alloy_rlp::EMPTY_STRING_CODE + 32;
    match RlpNode::from_raw(&raw) {
        Some(node) => node,
        None => panic!("a 33-byte reference fits"),
    }
};

/// The buffers of deferred hashing, a few megabytes in a large block: kept per thread between
/// updates (see [`WorkerOutput::new`]) so that each block reuses memory the allocator already holds
/// instead of faulting in fresh pages.
#[derive(Debug, Default)]
struct Scratch {
    pending: Vec<Pending>,
    bytes: Vec<u8>,
    patches: Vec<Patch>,
    /// Hashes of resolved pending nodes, by index, until [`WorkerOutput::settle`] is done with
    /// them.
    hashes: Vec<B256>,
    /// Pending nodes ordered by height, and the keccak batches' order.
    order: Vec<u32>,
    keccak_order: Vec<u32>,
    level_hashes: Vec<B256>,
}

impl Scratch {
    fn clear(&mut self) {
        self.pending.clear();
        self.bytes.clear();
        self.patches.clear();
        self.hashes.clear();
    }
}

thread_local! {
    /// Spare [`Scratch`] buffers of this thread.
    static SPARE: std::cell::RefCell<Vec<Scratch>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What one worker produced: node writes and deletes, its keccak count, and scratch buffers
/// reused for every node it encodes.
///
/// With `defer`, nodes of 32 bytes or more are written when finished but hashed only when
/// [`WorkerOutput::settle`] runs: then every pending node of one height is hashed in one batch (see
/// `keccak.rs`), several times cheaper than one by one where the CPU hashes eight at once.
#[derive(Debug)]
pub(crate) struct WorkerOutput {
    pub nodes: NodeUpdates,
    pub keccak_calls: u64,
    rlp: Vec<u8>,
    value: Vec<u8>,
    defer: bool,
    scratch: Pooled,
}

/// Spare [`Scratch`] buffers a thread keeps (most are a small task's few kilobytes). With two,
/// most of a parallel update's tasks grew fresh buffers every block (reallocations and page
/// faults in the profile).
const SPARES_PER_THREAD: usize = 64;

/// A [`Scratch`] that goes back to its thread's spares when dropped.
#[derive(Debug, Default)]
struct Pooled(Scratch);

impl Pooled {
    fn take() -> Self {
        Self(
            SPARE
                .try_with(|spare| spare.borrow_mut().pop())
                .ok()
                .flatten()
                .unwrap_or_default(),
        )
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.0.bytes.capacity() == 0 {
            return;
        }
        let mut scratch = std::mem::take(&mut self.0);
        scratch.clear();
        // Enough for the next block's tasks (a parent drops its sixteen tasks' buffers on its
        // own thread); beyond that they are freed.
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < SPARES_PER_THREAD {
                spare.push(scratch);
            }
        });
    }
}

impl WorkerOutput {
    pub(crate) fn new(defer: bool) -> Self {
        let scratch = if defer {
            Pooled::take()
        } else {
            Pooled::default()
        };
        Self {
            nodes: NodeUpdates::default(),
            keccak_calls: 0,
            rlp: Vec::new(),
            value: Vec::new(),
            defer,
            scratch,
        }
    }

    fn pending_count(&self) -> usize {
        self.scratch.0.pending.len()
    }

    /// Moves `other`'s writes, deletes and pending nodes here; returns the offset to add to
    /// `other`'s pending references.
    fn merge(&mut self, mut other: Self) -> u32 {
        let chunks = self.nodes.append(&mut other.nodes);
        self.keccak_calls += other.keccak_calls;
        let ours = &mut self.scratch.0;
        let offset = ours.pending.len() as u32;
        let theirs = &mut other.scratch.0;
        if !theirs.pending.is_empty() {
            let bytes = ours.bytes.len() as u32;
            let patches = ours.patches.len() as u32;
            ours.bytes.extend_from_slice(&theirs.bytes);
            ours.patches.extend(theirs.patches.iter().map(|p| Patch {
                at: p.at + bytes,
                child: p.child + offset,
            }));
            ours.pending.extend(theirs.pending.iter().map(|p| Pending {
                height: p.height,
                write: WriteSlot {
                    chunk: p.write.chunk + chunks,
                    index: p.write.index,
                },
                bytes: (p.bytes.0 + bytes, p.bytes.1 + bytes),
                patches: (p.patches.0 + patches, p.patches.1 + patches),
            }));
        }
        offset
    }

    /// Finishes `node` at `path`: encodes it over its children's references (a branch's, in
    /// nibble order; an extension's one child; none for a leaf) and writes it, its reference
    /// to follow if pending. Returns its reference.
    fn finish(&mut self, path: Nibbles, mut node: Node, children: &[Ref]) -> Ref {
        let mut refs: [RlpNode; 16] = std::array::from_fn(|_| RlpNode::default());
        let mut height = 0u8;
        let mut any_pending = false;
        for (slot, child) in refs.iter_mut().zip(children) {
            *slot = match child {
                Ref::Known(reference) => reference.clone(),
                Ref::Pending(i) => {
                    any_pending = true;
                    height = height.max(self.scratch.0.pending[*i as usize].height + 1);
                    PLACEHOLDER_REF
                }
            };
        }
        let refs = &refs[..children.len()];
        if let Node::Extension { child, .. } = &mut node
            && let Some(first) = refs.first()
        {
            child.clone_from(first);
        }
        if !self.defer {
            self.rlp.clear();
            node.encode(refs, &mut self.rlp);
            let reference = rlp_node_counted(&self.rlp, &mut self.keccak_calls);
            return self.write_known(path, node, reference);
        }
        let scratch = &mut self.scratch.0;
        let start = scratch.bytes.len();
        node.encode(refs, &mut scratch.bytes);
        let len = scratch.bytes.len() - start;
        if len < 32 {
            // Shorter than a hash, so no child of it is hashed: it is final now.
            let reference = RlpNode::from_raw(&scratch.bytes[start..]).unwrap_or_default();
            scratch.bytes.truncate(start);
            return self.write_known(path, node, reference);
        }
        let first_patch = scratch.patches.len() as u32;
        if any_pending {
            match &node {
                Node::Extension { .. } => {
                    // The child is the last item.
                    if let Some(Ref::Pending(child)) = children.first() {
                        scratch.patches.push(Patch {
                            at: (start + len - 32) as u32,
                            child: *child,
                        });
                    }
                }
                Node::Branch { state_mask, value } => {
                    // Sixteen child items and the value item follow the list header.
                    let value_len = value
                        .as_ref()
                        .map_or(1, |v| alloy_rlp::Encodable::length(&v[..]));
                    let items: usize =
                        refs.iter().map(|r| r.len()).sum::<usize>() + (16 - refs.len()) + value_len;
                    let mut at = start + (len - items);
                    let mut next = children.iter();
                    for nibble in 0..16u8 {
                        if !state_mask.is_bit_set(nibble) {
                            at += 1;
                            continue;
                        }
                        match next.next() {
                            Some(Ref::Pending(child)) => {
                                scratch.patches.push(Patch {
                                    at: (at + 1) as u32,
                                    child: *child,
                                });
                                at += PLACEHOLDER_REF.len();
                            }
                            Some(Ref::Known(reference)) => at += reference.len(),
                            None => break,
                        }
                    }
                }
                Node::Leaf { .. } => {}
            }
        }
        let write = self.nodes.push_write_slot(
            path,
            StoredNode {
                node,
                reference: PLACEHOLDER_REF,
            },
        );
        scratch.pending.push(Pending {
            height,
            write,
            bytes: (start as u32, scratch.bytes.len() as u32),
            patches: (first_patch, scratch.patches.len() as u32),
        });
        Ref::Pending(scratch.pending.len() as u32 - 1)
    }

    fn write_known(&mut self, path: Nibbles, node: Node, reference: RlpNode) -> Ref {
        self.nodes.push_write(
            path,
            StoredNode {
                node,
                reference: reference.clone(),
            },
        );
        Ref::Known(reference)
    }

    /// Encodes an extension or leaf, queues it for writing at `path`, and returns its reference.
    fn commit_short(&mut self, path: Nibbles, short: Short) -> Ref {
        match short {
            Short::Leaf(key, value) => self.finish(path, Node::Leaf { key, value }, &[]),
            Short::Extension(key, child) => self.finish(
                path,
                Node::Extension {
                    key,
                    child: RlpNode::default(),
                },
                &[child],
            ),
        }
    }

    fn delete(&mut self, path: Nibbles) {
        self.nodes.push_delete(path);
    }

    /// Hashes every pending node, height by height, and fills in the references of their
    /// writes. The hashes stay readable through [`WorkerOutput::known`] until
    /// [`WorkerOutput::settle`] ends.
    fn resolve(&mut self) {
        let Scratch {
            pending,
            bytes,
            patches,
            hashes,
            order,
            keccak_order,
            level_hashes,
        } = &mut self.scratch.0;
        if pending.is_empty() {
            return;
        }
        hashes.clear();
        hashes.resize(pending.len(), B256::ZERO);
        // By height, creation order within one (a counting sort: heights are small).
        let top = pending
            .iter()
            .map(|p| usize::from(p.height))
            .max()
            .unwrap_or(0);
        let mut counts = vec![0u32; top + 2];
        for p in pending.iter() {
            counts[usize::from(p.height) + 1] += 1;
        }
        for h in 1..counts.len() {
            counts[h] += counts[h - 1];
        }
        order.clear();
        order.resize(pending.len(), 0);
        for (i, p) in pending.iter().enumerate() {
            let at = &mut counts[usize::from(p.height)];
            order[*at as usize] = i as u32;
            *at += 1;
        }
        let mut start = 0;
        while start < order.len() {
            let height = pending[order[start] as usize].height;
            let end = start
                + order[start..]
                    .iter()
                    .take_while(|&&i| pending[i as usize].height == height)
                    .count();
            let level = &order[start..end];
            // The children are lower, so resolved: put their hashes in place.
            for &i in level {
                let (from, to) = pending[i as usize].patches;
                for patch in &patches[from as usize..to as usize] {
                    let at = patch.at as usize;
                    bytes[at..at + 32].copy_from_slice(&hashes[patch.child as usize][..]);
                }
            }
            let inputs: Vec<&[u8]> = level
                .iter()
                .map(|&i| {
                    let (from, to) = pending[i as usize].bytes;
                    &bytes[from as usize..to as usize]
                })
                .collect();
            level_hashes.clear();
            level_hashes.resize(level.len(), B256::ZERO);
            crate::keccak::keccak256_many(&inputs, level_hashes, keccak_order);
            for (&i, hash) in level.iter().zip(level_hashes.iter()) {
                hashes[i as usize] = *hash;
            }
            start = end;
        }
        self.keccak_calls += pending.len() as u64;
        for (p, hash) in pending.iter().zip(hashes.iter()) {
            let stored = self.nodes.write_mut(p.write);
            stored.reference = RlpNode::word_rlp(hash);
            if let Node::Extension { child, .. } = &mut stored.node
                && let Some(patch) = patches[p.patches.0 as usize..p.patches.1 as usize].first()
            {
                *child = RlpNode::word_rlp(&hashes[patch.child as usize]);
            }
        }
        pending.clear();
        bytes.clear();
        patches.clear();
    }

    /// The final reference of `r`, once [`WorkerOutput::resolve`] has run.
    fn known(&self, r: &Ref) -> RlpNode {
        match r {
            Ref::Known(reference) => reference.clone(),
            Ref::Pending(i) => RlpNode::word_rlp(&self.scratch.0.hashes[*i as usize]),
        }
    }

    /// Resolves the pending nodes and makes the references in `value` final.
    fn settle<T: HasRefs>(&mut self, value: T) -> T {
        if self.scratch.0.pending.is_empty() {
            return value;
        }
        self.resolve();
        let settled = value.map_refs(|r| Ref::Known(self.known(&r)));
        self.scratch.0.hashes.clear();
        settled
    }
}

/// Pending nodes a parallel task hands back unresolved, for its caller to hash with its
/// siblings'; a task with more resolves them itself, on its own thread. Unit tests use a
/// small value so that their small tries take both paths.
const RESOLVE_IN_TASK: usize = if cfg!(test) { 4 } else { 256 };

/// Runs one parallel task into an output of its own. A task with many pending nodes hashes
/// them before it returns, on its own thread, so that large tasks' hashing runs side by side
/// instead of in the caller's merge loop.
fn run_task<T: HasRefs>(
    defer: bool,
    task: impl FnOnce(&mut WorkerOutput) -> Result<T, TrieError>,
) -> Result<(T, WorkerOutput), TrieError> {
    let mut local = WorkerOutput::new(defer);
    let value = task(&mut local)?;
    let value = if local.pending_count() >= RESOLVE_IN_TASK {
        local.settle(value)
    } else {
        value
    };
    Ok((value, local))
}

/// Merges a task's output (from [`run_task`]) into the caller's.
fn merge_task<T: HasRefs>(out: &mut WorkerOutput, local: WorkerOutput, value: T) -> T {
    let offset = out.merge(local);
    value.map_refs(|r| r.shifted(offset))
}

/// An extension or a leaf that is not yet placed.
#[derive(Clone, Debug)]
enum Short {
    Extension(Nibbles, Ref),
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
}

/// The state of a subtree after its updates.
enum Sub {
    /// Exactly as before; the parent keeps the stored reference.
    Unchanged,
    /// No node is left.
    Empty,
    /// A branch, finished (written, or pending in the output) at the subtree's path.
    Branch(Ref),
    /// An extension or leaf for the parent to place.
    Short(Short),
}

impl HasRefs for Sub {
    fn map_refs(self, mut f: impl FnMut(Ref) -> Ref) -> Self {
        match self {
            Self::Branch(r) => Self::Branch(f(r)),
            Self::Short(Short::Extension(key, r)) => Self::Short(Short::Extension(key, f(r))),
            other => other,
        }
    }
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
    ctx: &UpdateSource<'_, S>,
    updates: &[(Nibbles, O)],
    wiped: bool,
    out: &mut WorkerOutput,
) -> Result<RootChange, TrieError> {
    let root = Nibbles::new();
    let existing = if wiped { None } else { ctx.get(&root)? };
    let existed = existing.is_some();
    let sub = match update_node(ctx, root, existing.as_ref().map(|s| &s.node), updates, out)? {
        Sub::Short(short) => Sub::Branch(out.commit_short(root, short)),
        other => other,
    };
    Ok(match out.settle(sub) {
        Sub::Unchanged => RootChange::Unchanged,
        Sub::Empty if !existed && !wiped => RootChange::Unchanged,
        Sub::Empty => {
            if existed {
                out.delete(root);
            }
            RootChange::Changed(EMPTY_ROOT_HASH)
        }
        Sub::Branch(reference) => {
            RootChange::Changed(root_hash_of(&out.known(&reference), &mut out.keccak_calls))
        }
        Sub::Short(_) => return Err(TrieError::Invariant("root node left unplaced")),
    })
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
    ctx: &UpdateSource<'_, S>,
    key: &Nibbles,
) -> Result<Option<Value>, TrieError> {
    let mut path = Nibbles::new();
    loop {
        let Some(stored) = ctx.get(&path)? else {
            return Ok(None);
        };
        ctx.check(&path, &stored.node)?;
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
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    existing: Option<&Node>,
    updates: &[(Nibbles, O)],
    out: &mut WorkerOutput,
) -> Result<Sub, TrieError> {
    if updates.is_empty() {
        return Ok(if existing.is_some() {
            Sub::Unchanged
        } else {
            Sub::Empty
        });
    }
    if let Some(node) = existing {
        ctx.check(&path, node)?;
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
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    key: Nibbles,
    value: &Value,
    updates: &[(Nibbles, O)],
    out: &mut WorkerOutput,
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
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    key: Nibbles,
    child: RlpNode,
    updates: &[(Nibbles, O)],
    out: &mut WorkerOutput,
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
        if !matches!(child_node.node, Node::Branch { .. }) {
            return Err(ctx.malformed(&full, "extension child is not a branch"));
        }
        return Ok(
            match update_node(ctx, full, Some(&child_node.node), updates, out)? {
                Sub::Unchanged => Sub::Unchanged,
                Sub::Empty => {
                    out.delete(full);
                    Sub::Empty
                }
                Sub::Branch(reference) => Sub::Short(Short::Extension(key, reference)),
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
            virtual_child: Some((nibble, rest, child)),
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
        Sub::Branch(reference) => Sub::Short(Short::Extension(prefix, reference)),
        Sub::Short(short) => Sub::Short(short.prepend(&prefix)),
    })
}

/// A branch to update: a stored one, or one that exists only during this update because an
/// extension is being split (then its one child may not be in the store either).
struct BranchIn {
    /// The children that are in the store.
    state_mask: TrieMask,
    value: Option<Value>,
    /// A child under a nibble outside `state_mask` that is not in the store: the rest of a
    /// split extension (its nibble, key and child).
    virtual_child: Option<(u8, Nibbles, RlpNode)>,
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
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    branch: BranchIn,
    updates: &[(Nibbles, O)],
    out: &mut WorkerOutput,
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
    let virtual_node = branch.virtual_child.as_ref().map(|(nibble, key, child)| {
        let node = Node::Extension {
            key: *key,
            child: child.clone(),
        };
        (*nibble, node)
    });
    // The split-off rest of an extension, as a short node to place.
    let virtual_short =
        |key: &Nibbles, child: &RlpNode| Short::Extension(*key, Ref::Known(child.clone()));
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
        let outputs: Vec<Result<(Sub, WorkerOutput), TrieError>> = groups
            .as_slice()
            .par_iter()
            .with_max_len(1)
            .map(|&(nibble, start, end)| {
                run_task(ctx.defer, |local| {
                    let child = child_path(&path, nibble);
                    update_node(ctx, child, existing(nibble), &updates[start..end], local)
                })
            })
            .collect();
        for (&(nibble, _, _), output) in groups.as_slice().iter().zip(outputs) {
            let (sub, local) = output?;
            results[usize::from(nibble)] = Some(merge_task(out, local, sub));
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
        let mut children: [Ref; 16] = std::array::from_fn(|_| Ref::Known(RlpNode::default()));
        for (i, nibble) in state_mask.iter().enumerate() {
            let child = child_path(&path, nibble);
            children[i] = match results[usize::from(nibble)].take() {
                Some(Sub::Branch(reference)) => reference,
                Some(Sub::Short(short)) => out.commit_short(child, short),
                _ => match (stored.reference(nibble), &branch.virtual_child) {
                    (Some(reference), _) => Ref::Known(reference.clone()),
                    // The split-off rest of an extension is written now that it has a sibling.
                    (None, Some((_, key, grandchild))) => {
                        out.commit_short(child, virtual_short(key, grandchild))
                    }
                    (None, None) => {
                        return Err(TrieError::Invariant("branch child without a node"));
                    }
                },
            };
        }
        let node = Node::Branch { state_mask, value };
        let reference = out.finish(path, node, &children[..count as usize]);
        return Ok(Sub::Branch(reference));
    }

    if count == 1 {
        // One child left and no value: this branch disappears into its child.
        let Some(nibble) = state_mask.first_set_bit_index() else {
            return Err(TrieError::Invariant("mask with one bit has no first bit"));
        };
        let child = child_path(&path, nibble);
        let was_stored = branch.state_mask.is_bit_set(nibble);
        return Ok(match results[usize::from(nibble)].take() {
            Some(Sub::Branch(reference)) => {
                Sub::Short(Short::Extension(single_nibble(nibble), reference))
            }
            Some(Sub::Short(short)) => {
                if was_stored {
                    out.delete(child);
                }
                Sub::Short(short.prepend_nibble(nibble))
            }
            _ => match (stored.node(nibble), &branch.virtual_child) {
                (Some(node), _) => match ctx.check(&child, node).map(|()| node)? {
                    Node::Branch { .. } => Sub::Short(Short::Extension(
                        single_nibble(nibble),
                        Ref::Known(
                            stored
                                .reference(nibble)
                                .ok_or(TrieError::Invariant("stored child without a reference"))?
                                .clone(),
                        ),
                    )),
                    Node::Extension {
                        key,
                        child: grandchild,
                    } => {
                        out.delete(child);
                        Sub::Short(
                            Short::Extension(*key, Ref::Known(grandchild.clone()))
                                .prepend_nibble(nibble),
                        )
                    }
                    Node::Leaf { key, value } => {
                        out.delete(child);
                        Sub::Short(Short::Leaf(*key, value.clone()).prepend_nibble(nibble))
                    }
                },
                (None, Some((_, key, grandchild))) => {
                    Sub::Short(virtual_short(key, grandchild).prepend_nibble(nibble))
                }
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
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    updates: &[(Nibbles, O)],
    out: &mut WorkerOutput,
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
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    entries: &[(Nibbles, Value)],
    out: &mut WorkerOutput,
) -> Result<Sub, TrieError> {
    let depth = path.len();
    match entries {
        [] => Ok(Sub::Empty),
        [(key, value)] => Ok(Sub::Short(Short::Leaf(key.slice(depth..), value.clone()))),
        [(first, _), .., (last, _)] => {
            let shared = first.common_prefix_length(last);
            if shared > depth {
                let at = first.slice(..shared);
                let reference = build_branch(ctx, at, entries, out)?;
                Ok(Sub::Short(Short::Extension(
                    first.slice(depth..shared),
                    reference,
                )))
            } else {
                Ok(Sub::Branch(build_branch(ctx, path, entries, out)?))
            }
        }
    }
}

/// Builds the branch at `path` over at least two entries that diverge at `path` (or one of
/// which ends there), with its subtree; returns its reference.
fn build_branch<S: NodeStore>(
    ctx: &UpdateSource<'_, S>,
    path: Nibbles,
    entries: &[(Nibbles, Value)],
    out: &mut WorkerOutput,
) -> Result<Ref, TrieError> {
    let depth = path.len();
    let (value, rest) = match entries.split_first() {
        Some(((key, value), rest)) if key.len() == depth => (Some(value.clone()), rest),
        _ => (None, entries),
    };
    let groups = nibble_groups(rest, depth);
    let build_child = |nibble: u8, start: usize, end: usize, out: &mut WorkerOutput| {
        let child = child_path(&path, nibble);
        match build_fresh(ctx, child, &rest[start..end], out)? {
            Sub::Branch(reference) => Ok(reference),
            Sub::Short(short) => Ok(out.commit_short(child, short)),
            // A run is never empty, so neither is its subtree.
            Sub::Empty | Sub::Unchanged => {
                Err(TrieError::Invariant("empty subtree from a non-empty run"))
            }
        }
    };

    let mut children: [Ref; 16] = std::array::from_fn(|_| Ref::Known(RlpNode::default()));
    if rest.len() >= ctx.split_at && groups.len > 1 {
        let results: Vec<Result<(Ref, WorkerOutput), TrieError>> = groups
            .as_slice()
            .par_iter()
            .with_max_len(1)
            .map(|&(nibble, start, end)| {
                run_task(ctx.defer, |local| build_child(nibble, start, end, local))
            })
            .collect();
        for (i, result) in results.into_iter().enumerate() {
            let (reference, local) = result?;
            children[i] = merge_task(out, local, reference);
        }
    } else {
        for (i, &(nibble, start, end)) in groups.as_slice().iter().enumerate() {
            children[i] = build_child(nibble, start, end, out)?;
        }
    }
    let mut state_mask = TrieMask::default();
    for &(nibble, _, _) in groups.as_slice() {
        state_mask.set_bit(nibble);
    }
    let node = Node::Branch { state_mask, value };
    Ok(out.finish(path, node, &children[..groups.len]))
}
