//! Where trie nodes live between blocks: the [`NodeStore`] trait, the batch of changes a block
//! produces ([`StateTrieUpdates`]), and an in-memory store.

use crate::node::{Node, StoredNode, child_index};
use alloy_primitives::{
    B256,
    map::{B256Map, HashMap},
};
use alloy_trie::{Nibbles, TrieMask, nodes::RlpNode};
use overdrive_primitives::prefetch;
use rayon::prelude::*;
use std::{borrow::Cow, collections::BTreeMap, convert::Infallible, sync::Arc};

/// Which trie of the state a node belongs to. Every storage trie has its own path namespace,
/// so a wipe can drop a whole trie without walking it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrieId {
    /// The account trie (also the namespace of a stand-alone [`crate::RawTrie`]).
    Account,
    /// The storage trie of the account with this hashed address.
    Storage(B256),
}

/// A place that holds trie nodes by path.
///
/// Two required operations, so that a database-backed store is easy to write: read one node,
/// and write one block's batch. `get_children` has a default built on `get`; a store that
/// keeps siblings together overrides it. Reads come from several worker threads at once.
pub trait NodeStore: Send + Sync {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The node at `path` of `trie`, if there is one: borrowed from an in-memory store,
    /// owned (decoded) from a database.
    fn get(&self, trie: TrieId, path: &Nibbles)
    -> Result<Option<Cow<'_, StoredNode>>, Self::Error>;

    /// The nodes directly under `path` for the nibbles in `nibbles`, by nibble. A store that
    /// keeps siblings together can answer this with one lookup instead of one per child.
    fn get_children(
        &self,
        trie: TrieId,
        path: &Nibbles,
        nibbles: TrieMask,
    ) -> Result<[Option<Cow<'_, StoredNode>>; 16], Self::Error> {
        let mut children: [Option<Cow<'_, StoredNode>>; 16] = Default::default();
        for nibble in nibbles.iter() {
            let mut child = *path;
            child.push_unchecked(nibble);
            children[usize::from(nibble)] = self.get(trie, &child)?;
        }
        Ok(children)
    }

    /// The nodes directly under `path` for the nibbles in `nibbles`, as one [`ChildNodes`]:
    /// what the trie reads at every branch it updates. The default collects
    /// [`NodeStore::get_children`]; a store that keeps siblings together hands out borrowed
    /// slices of them instead, so that no node is copied.
    fn get_child_nodes(
        &self,
        trie: TrieId,
        path: &Nibbles,
        nibbles: TrieMask,
    ) -> Result<ChildNodes<'_>, Self::Error> {
        if nibbles.is_empty() {
            return Ok(ChildNodes::default());
        }
        let children = self.get_children(trie, path, nibbles)?;
        let mut mask = TrieMask::default();
        let mut refs = Vec::with_capacity(nibbles.count_ones() as usize);
        let mut nodes = Vec::with_capacity(refs.capacity());
        for (nibble, child) in (0u8..).zip(children) {
            if let Some(child) = child {
                let child = child.into_owned();
                mask.set_bit(nibble);
                refs.push(child.reference);
                nodes.push(child.node);
            }
        }
        Ok(ChildNodes::new(mask, Cow::Owned(refs), Cow::Owned(nodes)))
    }

    /// A hint that [`NodeStore::get_child_nodes`] of `path` follows soon, and the nodes of
    /// the nibbles in `nibbles` will be read: a store may start loading them so that the
    /// loads of several paths overlap. The default does nothing.
    fn prefetch_children(&self, trie: TrieId, path: &Nibbles, nibbles: TrieMask) {
        let _ = (trie, path, nibbles);
    }

    /// Applies one block's changes. Order within a trie: a wipe first, then deletes, then
    /// writes (the trie never emits a delete and a write of the same path in one batch).
    ///
    /// All or nothing: on an error the store must hold what it held before the call (a
    /// database store writes the batch in one transaction). The trie keeps its old root when
    /// `apply` fails, so a half-applied batch would leave nodes that no root describes.
    fn apply(&mut self, updates: &StateTrieUpdates) -> Result<(), Self::Error>;

    /// [`NodeStore::apply`], also returning the nodes the batch replaced, where the store can
    /// take them out as it writes: cheaper than reading them first for a batch that may be
    /// taken back ([`crate::StateTrie::commit_with_undo`]). `Ok(None)`: the store cannot, and
    /// nothing was applied.
    fn apply_replacing(
        &mut self,
        updates: &StateTrieUpdates,
    ) -> Result<Option<Replaced>, Self::Error> {
        let _ = updates;
        Ok(None)
    }
}

/// The nodes a batch replaced ([`NodeStore::apply_replacing`]): what each path it wrote or
/// deleted held before it, and the whole old trie of each storage trie it wiped.
#[derive(Debug, Default)]
pub struct Replaced {
    pub(crate) accounts: ReplacedNodes,
    pub(crate) storages: B256Map<ReplacedNodes>,
    /// The storage tries the batch wiped, as they were.
    pub(crate) wiped: MemNodeStore,
}

/// The node each path a batch wrote or deleted held before it (`None`: none), in the order
/// the store applied them. A batch changes each path once.
pub(crate) type ReplacedNodes = Vec<(Nibbles, Option<StoredNode>)>;

/// The children of one path, by nibble: each child's node and its reference, in nibble order,
/// borrowed from the store or owned.
///
/// References and nodes are separate slices because a branch update reads the reference of
/// every child but the node only of the children it descends into: kept apart in the store,
/// the sixteen references of a full branch fill nine cache lines instead of sixteen nodes' worth.
#[derive(Clone, Debug, Default)]
pub struct ChildNodes<'a> {
    /// Which nibbles the slices hold, in order.
    layout: TrieMask,
    /// Which of them are handed out (the ones asked for).
    visible: TrieMask,
    refs: Cow<'a, [RlpNode]>,
    nodes: Cow<'a, [Node]>,
    /// Which nibbles hold a branch, and which an extension.
    kinds: Kinds,
}

/// Which children of a path are branches and which extensions: what a branch's database row
/// asks of each child ([`crate::CompactTrie`]), answered without reading the children's nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Kinds {
    branches: TrieMask,
    extensions: TrieMask,
}

impl Kinds {
    /// Records `node` (or no node) as the child under `nibble`.
    fn set(&mut self, nibble: u8, node: Option<&Node>) {
        self.branches.unset_bit(nibble);
        self.extensions.unset_bit(nibble);
        match node {
            Some(Node::Branch { .. }) => self.branches.set_bit(nibble),
            Some(Node::Extension { .. }) => self.extensions.set_bit(nibble),
            Some(Node::Leaf { .. }) | None => {}
        }
    }
}

impl<'a> ChildNodes<'a> {
    /// The children in `mask`: `refs[i]` and `nodes[i]` belong to the `i`-th nibble of `mask`.
    /// A nibble whose position is past the end of a slice has no child.
    pub fn new(mask: TrieMask, refs: Cow<'a, [RlpNode]>, nodes: Cow<'a, [Node]>) -> Self {
        let mut kinds = Kinds::default();
        for (nibble, node) in mask.iter().zip(nodes.iter()) {
            kinds.set(nibble, Some(node));
        }
        Self::with_kinds(mask, refs, nodes, kinds)
    }

    /// [`ChildNodes::new`], with the kinds of the children already known.
    fn with_kinds(
        mask: TrieMask,
        refs: Cow<'a, [RlpNode]>,
        nodes: Cow<'a, [Node]>,
        kinds: Kinds,
    ) -> Self {
        Self {
            layout: mask,
            visible: mask,
            refs,
            nodes,
            kinds,
        }
    }

    /// The nibbles that have a child.
    pub fn mask(&self) -> TrieMask {
        self.visible
    }

    /// The nibbles whose child is a branch.
    pub fn branches(&self) -> TrieMask {
        TrieMask::new(self.kinds.branches.get() & self.visible.get())
    }

    /// The nibbles whose child is an extension.
    pub fn extensions(&self) -> TrieMask {
        TrieMask::new(self.kinds.extensions.get() & self.visible.get())
    }

    /// Hides the children outside `nibbles` (a store may hold siblings the caller did not
    /// ask for).
    pub(crate) fn restrict(&mut self, nibbles: TrieMask) {
        self.visible = TrieMask::new(self.visible.get() & nibbles.get());
    }

    #[inline]
    fn index(&self, nibble: u8) -> Option<usize> {
        self.visible
            .is_bit_set(nibble)
            .then(|| child_index(self.layout, nibble))
    }

    /// The child node under `nibble`.
    #[inline]
    pub fn node(&self, nibble: u8) -> Option<&Node> {
        self.nodes.get(self.index(nibble)?)
    }

    /// The reference of the child under `nibble`.
    #[inline]
    pub fn reference(&self, nibble: u8) -> Option<&RlpNode> {
        self.refs.get(self.index(nibble)?)
    }

    /// Whether the child under `nibble` has both its node and its reference.
    #[inline]
    pub fn has(&self, nibble: u8) -> bool {
        self.index(nibble)
            .is_some_and(|i| i < self.refs.len() && i < self.nodes.len())
    }
}

/// Writes per chunk of a [`NodeUpdates`] (about 50 KB).
const WRITE_CHUNK: usize = 256;

/// Node writes and deletes of one trie.
///
/// Writes are kept in the chunks the workers produced, so that joining the output of parallel
/// subtrees moves vectors instead of copying nodes. Two batches are equal when they write the
/// same nodes in the same order and delete the same paths, however they are chunked.
#[derive(Clone, Debug, Default)]
pub struct NodeUpdates {
    writes: Vec<Vec<(Nibbles, StoredNode)>>,
    write_count: usize,
    deletes: Vec<Nibbles>,
}

impl NodeUpdates {
    /// Whether there is nothing to write or delete.
    pub fn is_empty(&self) -> bool {
        self.write_count == 0 && self.deletes.is_empty()
    }

    /// Nodes to store (insert or overwrite), with their paths.
    pub fn writes(&self) -> impl Iterator<Item = &(Nibbles, StoredNode)> + '_ {
        self.writes.iter().flatten()
    }

    /// Number of node writes.
    pub fn write_count(&self) -> usize {
        self.write_count
    }

    /// Paths whose nodes no longer exist.
    pub fn deletes(&self) -> &[Nibbles] {
        &self.deletes
    }

    /// Adds a node write.
    pub fn push_write(&mut self, path: Nibbles, node: StoredNode) {
        self.push_write_slot(path, node);
    }

    /// Adds a node write and says where it sits.
    pub(crate) fn push_write_slot(&mut self, path: Nibbles, node: StoredNode) -> WriteSlot {
        // Fixed-size chunks: a batch never reallocates (and copies) a large vector, and the
        // allocator serves every chunk from memory it keeps, instead of mapping fresh pages.
        match self.writes.last_mut() {
            Some(chunk) if chunk.len() < chunk.capacity() || chunk.capacity() < WRITE_CHUNK => {
                chunk.push((path, node))
            }
            _ => {
                let mut chunk = Vec::with_capacity(WRITE_CHUNK);
                chunk.push((path, node));
                self.writes.push(chunk);
            }
        }
        self.write_count += 1;
        WriteSlot {
            chunk: self.writes.len() as u32 - 1,
            index: self.writes.last().map_or(0, |c| c.len() as u32 - 1),
        }
    }

    /// The node of an earlier write, to fill in what was not known when it was queued.
    pub(crate) fn write_mut(&mut self, slot: WriteSlot) -> &mut StoredNode {
        &mut self.writes[slot.chunk as usize][slot.index as usize].1
    }

    /// Adds a delete.
    pub fn push_delete(&mut self, path: Nibbles) {
        self.deletes.push(path);
    }

    /// Moves `other`'s writes and deletes to the end of this batch (later writes continue
    /// in the last appended chunk, so the order of writes is kept). Returns the number of
    /// chunks before `other`'s, which a [`WriteSlot`] of `other` moves by.
    pub(crate) fn append(&mut self, other: &mut Self) -> u32 {
        let offset = self.writes.len() as u32;
        self.write_count += std::mem::take(&mut other.write_count);
        // Chunks are created by a push, so none is empty and slots move by `offset` exactly.
        self.writes.append(&mut other.writes);
        self.deletes.append(&mut other.deletes);
        offset
    }
}

/// Where one write sits in a [`NodeUpdates`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteSlot {
    pub chunk: u32,
    pub index: u32,
}

impl PartialEq for NodeUpdates {
    fn eq(&self, other: &Self) -> bool {
        self.write_count == other.write_count
            && self.deletes == other.deletes
            && self.writes().eq(other.writes())
    }
}

impl Eq for NodeUpdates {}

/// Changes to one storage trie.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageNodeUpdates {
    /// Drop every node of this storage trie before applying `nodes` (self-destruct, account
    /// deletion, or self-destruct then re-create in one block).
    pub wiped: bool,
    /// The nodes written and deleted after the wipe, if any.
    pub nodes: NodeUpdates,
}

/// Everything one block changes in the stored tries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateTrieUpdates {
    /// Changes to the account trie.
    pub account_nodes: NodeUpdates,
    /// Changes to storage tries, by hashed address.
    pub storage_tries: B256Map<StorageNodeUpdates>,
}

impl StateTrieUpdates {
    /// Number of node writes in all tries.
    pub fn writes(&self) -> usize {
        self.account_nodes.write_count()
            + self
                .storage_tries
                .values()
                .map(|s| s.nodes.write_count())
                .sum::<usize>()
    }

    /// Number of node deletes in all tries (wipes not counted).
    pub fn deletes(&self) -> usize {
        self.account_nodes.deletes.len()
            + self
                .storage_tries
                .values()
                .map(|s| s.nodes.deletes.len())
                .sum::<usize>()
    }

    /// Whether the block changed no node and wiped no trie.
    pub fn is_empty(&self) -> bool {
        self.account_nodes.is_empty()
            && self
                .storage_tries
                .values()
                .all(|s| !s.wiped && s.nodes.is_empty())
    }
}

/// Children kept in the map entry itself; a group with more keeps all of them in a
/// [`Spill`]. Most branches near the bottom of a large trie have two or three children.
const INLINE: usize = 3;

/// A node that stands for an empty slot (no heap part to drop).
const PLACEHOLDER: Node = Node::Branch {
    state_mask: TrieMask::new(0),
    value: None,
};

/// The nodes hanging under one path: the children of a branch (or of any path), kept
/// together so that a walk reading a branch's children finds them in one place.
///
/// Layout matters more than anything else here, since nearly every access misses the cache:
/// the mask and the spill pointer come first, next to the map key, so that the line a lookup
/// compares the key on also says where the children are (a `SmallVec` keeps its length at
/// its end, a line away). The references sit apart from the nodes, densely, since a branch
/// update reads all its children's references but only a few of their nodes.
#[repr(C)]
#[derive(Clone, Debug)]
struct Group {
    mask: TrieMask,
    /// Which children are branches and which extensions (in the padding before `spill`).
    kinds: Kinds,
    /// All children, by nibble, when there are more than [`INLINE`].
    spill: Option<Box<Spill>>,
    /// Otherwise the references of the nibbles in `mask`, in nibble order.
    refs: [RlpNode; INLINE],
    /// And their nodes; slots past the children hold [`PLACEHOLDER`].
    nodes: [Node; INLINE],
}

/// The children of a group with many of them, by nibble (unused nibbles hold placeholders).
#[repr(C)]
#[derive(Clone, Debug)]
struct Spill {
    refs: [RlpNode; 16],
    nodes: [Node; 16],
}

impl Default for Group {
    fn default() -> Self {
        Self {
            mask: TrieMask::default(),
            kinds: Kinds::default(),
            spill: None,
            refs: Default::default(),
            nodes: [PLACEHOLDER; INLINE],
        }
    }
}

impl Group {
    fn len(&self) -> usize {
        self.mask.count_ones() as usize
    }

    fn is_empty(&self) -> bool {
        self.mask.is_empty()
    }

    /// Where `nibble`'s child is (or would be) in the slots in use.
    fn position(&self, nibble: u8) -> usize {
        if self.spill.is_some() {
            usize::from(nibble)
        } else {
            child_index(self.mask, nibble)
        }
    }

    fn get(&self, nibble: u8) -> Option<StoredNode> {
        if !self.mask.is_bit_set(nibble) {
            return None;
        }
        let at = self.position(nibble);
        let (refs, nodes) = self.slots();
        Some(StoredNode {
            node: nodes.get(at)?.clone(),
            reference: refs.get(at)?.clone(),
        })
    }

    fn slots(&self) -> (&[RlpNode], &[Node]) {
        match &self.spill {
            Some(spill) => (&spill.refs, &spill.nodes),
            None => {
                let len = self.len().min(INLINE);
                (&self.refs[..len], &self.nodes[..len])
            }
        }
    }

    fn children(&self) -> ChildNodes<'_> {
        let (refs, nodes) = self.slots();
        let layout = if self.spill.is_some() {
            // Positions by nibble: every nibble is a slot.
            TrieMask::new(u16::MAX)
        } else {
            self.mask
        };
        let mut children = ChildNodes::with_kinds(
            layout,
            Cow::Borrowed(refs),
            Cow::Borrowed(nodes),
            self.kinds,
        );
        children.restrict(self.mask);
        children
    }

    /// Stores `node` under `nibble`; returns the node it replaces.
    fn set(&mut self, nibble: u8, node: &StoredNode) -> Option<StoredNode> {
        self.kinds.set(nibble, Some(&node.node));
        if self.mask.is_bit_set(nibble) {
            let at = self.position(nibble);
            let (refs, nodes) = self.slots_mut();
            let (slot, reference) = (nodes.get_mut(at)?, refs.get_mut(at)?);
            return Some(StoredNode {
                node: std::mem::replace(slot, node.node.clone()),
                reference: std::mem::replace(reference, node.reference.clone()),
            });
        }
        if self.spill.is_none() && self.len() == INLINE {
            // Moving to the heap: every child to its nibble's slot.
            let mut spill = Box::new(Spill {
                refs: Default::default(),
                nodes: [PLACEHOLDER; 16],
            });
            for (i, n) in self.mask.iter().enumerate() {
                spill.refs[usize::from(n)] = std::mem::take(&mut self.refs[i]);
                spill.nodes[usize::from(n)] = std::mem::replace(&mut self.nodes[i], PLACEHOLDER);
            }
            self.spill = Some(spill);
        }
        let at = self.position(nibble);
        let len = self.len();
        match &mut self.spill {
            Some(spill) => {
                spill.refs[at] = node.reference.clone();
                spill.nodes[at] = node.node.clone();
            }
            None => {
                // Shift the later children up one slot (`len < INLINE` here).
                self.refs[at..=len].rotate_right(1);
                self.nodes[at..=len].rotate_right(1);
                self.refs[at] = node.reference.clone();
                self.nodes[at] = node.node.clone();
            }
        }
        self.mask.set_bit(nibble);
        None
    }

    fn slots_mut(&mut self) -> (&mut [RlpNode], &mut [Node]) {
        match &mut self.spill {
            Some(spill) => (&mut spill.refs, &mut spill.nodes),
            None => (&mut self.refs, &mut self.nodes),
        }
    }

    /// Removes the node under `nibble` and returns it.
    fn remove(&mut self, nibble: u8) -> Option<StoredNode> {
        if !self.mask.is_bit_set(nibble) {
            return None;
        }
        let at = self.position(nibble);
        let len = self.len();
        self.mask.unset_bit(nibble);
        self.kinds.set(nibble, None);
        let (refs, nodes) = self.slots_mut();
        let removed = StoredNode {
            node: std::mem::replace(&mut nodes[at], PLACEHOLDER),
            reference: std::mem::take(&mut refs[at]),
        };
        match &mut self.spill {
            Some(_) => {
                if len - 1 <= INLINE {
                    // Back into the entry, in nibble order.
                    let spill = self.spill.take().map(|s| *s);
                    if let Some(mut spill) = spill {
                        for (i, n) in self.mask.iter().enumerate() {
                            self.refs[i] = std::mem::take(&mut spill.refs[usize::from(n)]);
                            self.nodes[i] =
                                std::mem::replace(&mut spill.nodes[usize::from(n)], PLACEHOLDER);
                        }
                    }
                }
            }
            None => {
                self.refs[at..len].rotate_left(1);
                self.nodes[at..len].rotate_left(1);
            }
        }
        Some(removed)
    }
}

/// Groups by parent path (at least one nibble long).
type GroupMap = HashMap<Nibbles, Group>;

/// The nodes of one trie. The root and its children apart, each node sits in the group of its
/// parent path (its path less the last nibble): a branch's children share one map entry, so
/// reading them costs one lookup. The groups are split over sixteen maps by first nibble, each
/// behind an `Arc` so that cloning the store is cheap and a clone copies only the shards it
/// later writes to.
#[derive(Clone, Debug, Default)]
struct MemTrie {
    root: Option<StoredNode>,
    top: Group,
    shards: [Arc<GroupMap>; 16],
}

/// Batches below this size are applied on the calling thread.
const PARALLEL_APPLY_MIN: usize = 2048;

/// Whether a batch of `len` changes is written in parallel: only when large, and only when
/// called on a pool thread (from [`crate::StateTrie`]), so that the store never wakes rayon's
/// global pool.
fn parallel(len: usize) -> bool {
    len >= PARALLEL_APPLY_MIN && rayon::current_thread_index().is_some()
}

/// One shard's part of a batch.
#[derive(Default)]
struct ShardBatch<'a> {
    deletes: Vec<&'a Nibbles>,
    writes: Vec<&'a (Nibbles, StoredNode)>,
}

impl ShardBatch<'_> {
    /// Writes the batch to `map`; with `replaced`, notes there what each path held.
    fn apply(&self, map: &mut Arc<GroupMap>, mut replaced: Option<&mut ReplacedNodes>) {
        if self.deletes.is_empty() && self.writes.is_empty() {
            return;
        }
        if let Some(replaced) = replaced.as_deref_mut() {
            replaced.reserve(self.deletes.len() + self.writes.len());
        }
        let mut note = |path: &Nibbles, old: Option<StoredNode>| {
            if let Some(replaced) = replaced.as_deref_mut() {
                replaced.push((*path, old));
            }
        };
        let map = Arc::make_mut(map);
        for path in &self.deletes {
            let parent = path.slice(..path.len() - 1);
            let mut old = None;
            if let Some(group) = map.get_mut(&parent) {
                old = group.remove(path.get_unchecked(path.len() - 1));
                if group.is_empty() {
                    map.remove(&parent);
                }
            }
            note(path, old);
        }
        // Siblings are written one after another: look their group up once.
        let mut i = 0;
        while let Some((path, _)) = self.writes.get(i) {
            let last = path.len() - 1;
            let group = map.entry(path.slice(..last)).or_default();
            while let Some((sibling, node)) = self.writes.get(i) {
                if sibling.len() != path.len() || sibling.common_prefix_length(path) < last {
                    break;
                }
                note(sibling, group.set(sibling.get_unchecked(last), node));
                i += 1;
            }
        }
    }
}

/// Where a path's node lives: the root, the top group, or a shard's group.
enum Slot {
    Root,
    Top(u8),
    Shard(usize, Nibbles, u8),
}

fn slot(path: &Nibbles) -> Slot {
    match path.len() {
        0 => Slot::Root,
        1 => Slot::Top(path.get_unchecked(0)),
        len => Slot::Shard(
            usize::from(path.get_unchecked(0)),
            path.slice(..len - 1),
            path.get_unchecked(len - 1),
        ),
    }
}

impl MemTrie {
    /// A deep copy (see [`MemNodeStore::detached`]).
    fn detached(&self) -> Self {
        Self {
            root: self.root.clone(),
            top: self.top.clone(),
            shards: self.shards.each_ref().map(|s| Arc::new(GroupMap::clone(s))),
        }
    }

    fn group(&self, parent: &Nibbles) -> Option<&Group> {
        match parent.first() {
            None => Some(&self.top),
            Some(nibble) => self.shards[usize::from(nibble)].get(parent),
        }
    }

    fn get(&self, path: &Nibbles) -> Option<Cow<'_, StoredNode>> {
        match slot(path) {
            Slot::Root => self.root.as_ref().map(Cow::Borrowed),
            Slot::Top(nibble) => self.top.get(nibble).map(Cow::Owned),
            Slot::Shard(shard, parent, nibble) => {
                self.shards[shard].get(&parent)?.get(nibble).map(Cow::Owned)
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.root.is_none() && self.top.is_empty() && self.shards.iter().all(|s| s.is_empty())
    }

    /// Drops every node at a path of `depth` nibbles or more (`depth` at least 1).
    fn retain_shallower(&mut self, depth: usize) {
        if depth <= 1 {
            self.top = Group::default();
        }
        // A group holds the nodes one nibble below its key. A map that once held many more
        // groups than now (a block's nodes below the depth, dropped) gives its room back too.
        for shard in &mut self.shards {
            if Self::shard_to_trim(shard, depth) {
                let map = Arc::make_mut(shard);
                map.retain(|parent, _| parent.len() + 1 < depth);
                map.shrink_to_fit();
            }
        }
    }

    /// Whether [`Self::retain_shallower`] would change anything.
    fn to_trim(&self, depth: usize) -> bool {
        (depth <= 1 && !self.top.is_empty())
            || self.shards.iter().any(|s| Self::shard_to_trim(s, depth))
    }

    fn shard_to_trim(shard: &GroupMap, depth: usize) -> bool {
        shard.capacity() > 2 * shard.len() + 64
            || shard.keys().any(|parent| parent.len() + 1 >= depth)
    }

    /// The length of the longest path holding a node (0 when there is none below the root).
    fn max_depth(&self) -> usize {
        let shards = self
            .shards
            .iter()
            .flat_map(|s| s.keys())
            .map(|parent| parent.len() + 1)
            .max();
        shards.unwrap_or(usize::from(!self.top.is_empty()))
    }

    /// Number of nodes at paths of `depth` nibbles or more.
    #[cfg(test)]
    fn count_from(&self, depth: usize) -> usize {
        let top = if depth <= 1 { self.top.len() } else { 0 };
        let root = usize::from(depth == 0 && self.root.is_some());
        root + top
            + self
                .shards
                .iter()
                .flat_map(|s| s.iter())
                .filter(|(parent, _)| parent.len() + 1 >= depth)
                .map(|(_, group)| group.len())
                .sum::<usize>()
    }

    /// About how many bytes the trie's maps hold: every allocated map slot (key, group and
    /// control byte) and every spilled group's children.
    fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(Nibbles, Group)>() + 1;
        self.shards
            .iter()
            .map(|shard| {
                shard.capacity() * slot
                    + shard.values().filter(|g| g.spill.is_some()).count()
                        * std::mem::size_of::<Spill>()
            })
            .sum::<usize>()
            + self
                .top
                .spill
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<Spill>())
    }

    fn len(&self) -> usize {
        usize::from(self.root.is_some())
            + self.top.len()
            + self
                .shards
                .iter()
                .flat_map(|s| s.values())
                .map(Group::len)
                .sum::<usize>()
    }

    /// Writes `updates`; with `note`, returns what each path they write or delete held
    /// (otherwise nothing).
    fn apply_noting(&mut self, updates: &NodeUpdates, note: bool) -> ReplacedNodes {
        let mut replaced = ReplacedNodes::default();
        let mut noted = |path: &Nibbles, old: Option<StoredNode>| {
            if note {
                replaced.push((*path, old));
            }
        };
        // Order the batch by shard, then write the shards in parallel.
        let mut batches: [ShardBatch<'_>; 16] = Default::default();
        let per_shard = updates.write_count() / 12 + 1;
        for batch in &mut batches {
            batch.writes.reserve(per_shard);
        }
        for path in updates.deletes() {
            match path.len() {
                0 => noted(path, self.root.take()),
                1 => noted(path, self.top.remove(path.get_unchecked(0))),
                _ => batches[usize::from(path.get_unchecked(0))]
                    .deletes
                    .push(path),
            }
        }
        for write in updates.writes() {
            let path = &write.0;
            match path.len() {
                0 => noted(path, self.root.replace(write.1.clone())),
                1 => noted(path, self.top.set(path.get_unchecked(0), &write.1)),
                _ => batches[usize::from(path.get_unchecked(0))]
                    .writes
                    .push(write),
            }
        }
        let mut shards_replaced: [ReplacedNodes; 16] = Default::default();
        let apply_shard = |((map, batch), replaced): (
            (&mut Arc<GroupMap>, &mut ShardBatch<'_>),
            &mut ReplacedNodes,
        )| batch.apply(map, note.then_some(replaced));
        if parallel(updates.write_count() + updates.deletes().len()) {
            self.shards
                .par_iter_mut()
                .zip(batches.par_iter_mut())
                .zip(shards_replaced.par_iter_mut())
                .for_each(apply_shard);
        } else {
            self.shards
                .iter_mut()
                .zip(batches.iter_mut())
                .zip(shards_replaced.iter_mut())
                .for_each(apply_shard);
        }
        if note {
            replaced.reserve(shards_replaced.iter().map(Vec::len).sum());
            for shard in shards_replaced {
                replaced.extend(shard);
            }
        }
        replaced
    }

    fn nodes(&self) -> BTreeMap<Nibbles, StoredNode> {
        fn add(out: &mut BTreeMap<Nibbles, StoredNode>, parent: &Nibbles, group: &Group) {
            for nibble in group.mask.iter() {
                let mut path = *parent;
                path.push_unchecked(nibble);
                if let Some(node) = group.get(nibble) {
                    out.insert(path, node);
                }
            }
        }
        let mut out = BTreeMap::new();
        if let Some(root) = &self.root {
            out.insert(Nibbles::new(), root.clone());
        }
        add(&mut out, &Nibbles::new(), &self.top);
        for shard in &self.shards {
            for (parent, group) in shard.iter() {
                add(&mut out, parent, group);
            }
        }
        out
    }
}

/// An in-memory [`NodeStore`].
///
/// Cloning is cheap (it shares the node maps and copies a shard only when a clone writes to
/// it), so a test runner can keep one store per block and fork a side chain from any of them.
#[derive(Clone, Debug, Default)]
pub struct MemNodeStore {
    accounts: MemTrie,
    storages: B256Map<Arc<MemTrie>>,
}

impl MemNodeStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// All nodes of one trie, by path.
    pub fn nodes(&self, trie: TrieId) -> BTreeMap<Nibbles, StoredNode> {
        match trie {
            TrieId::Account => self.accounts.nodes(),
            TrieId::Storage(owner) => self
                .storages
                .get(&owner)
                .map(|t| t.nodes())
                .unwrap_or_default(),
        }
    }

    /// A copy that shares no memory with this store, unlike a clone, which shares every shard
    /// it has not written to: two tries that must not warm each other's caches, such as the
    /// benchmark's side-by-side reference, each read their own.
    pub fn detached(&self) -> Self {
        Self {
            accounts: self.accounts.detached(),
            storages: self
                .storages
                .iter()
                .map(|(owner, trie)| (*owner, Arc::new(trie.detached())))
                .collect(),
        }
    }

    /// About how many bytes of memory the nodes take (what a [`MemNodeStore::detached`] copy
    /// allocates): the maps' slots and the spilled groups, not the rare values too long to
    /// keep inline.
    pub fn heap_bytes(&self) -> usize {
        // Each storage trie also has its own allocation and its sixteen (maybe empty) shards,
        // each an `Arc` with two counters.
        let per_trie = std::mem::size_of::<MemTrie>()
            + 16 * (std::mem::size_of::<GroupMap>() + 2 * std::mem::size_of::<usize>());
        let slot = std::mem::size_of::<(B256, Arc<MemTrie>)>() + 1;
        self.accounts.heap_bytes()
            + self.storages.capacity() * slot
            + self
                .storages
                .values()
                .map(|t| per_trie + t.heap_bytes())
                .sum::<usize>()
    }

    /// Drops every node at a path of `depth` nibbles or more, in every trie (`depth` at least
    /// 1: the roots stay), and gives the maps' spare room back.
    pub fn retain_shallower(&mut self, depth: usize) {
        let depth = depth.max(1);
        self.accounts.retain_shallower(depth);
        for trie in self.storages.values_mut() {
            if trie.to_trim(depth) {
                Arc::make_mut(trie).retain_shallower(depth);
            }
        }
    }

    /// The length of the longest path that holds a node, in any trie.
    pub fn max_depth(&self) -> usize {
        self.storages
            .values()
            .map(|t| t.max_depth())
            .chain([self.accounts.max_depth()])
            .max()
            .unwrap_or(0)
    }

    /// Number of nodes at paths of `depth` nibbles or more, in every trie.
    #[cfg(test)]
    pub(crate) fn count_from(&self, depth: usize) -> usize {
        self.accounts.count_from(depth)
            + self
                .storages
                .values()
                .map(|t| t.count_from(depth))
                .sum::<usize>()
    }

    /// Hashed addresses of the accounts that have a storage trie, sorted.
    pub fn storage_owners(&self) -> Vec<B256> {
        let mut owners: Vec<B256> = self.storages.keys().copied().collect();
        owners.sort_unstable();
        owners
    }

    /// Number of nodes of all tries.
    pub fn len(&self) -> usize {
        self.accounts.len() + self.storages.values().map(|t| t.len()).sum::<usize>()
    }

    /// Whether the store holds no node.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.storages.is_empty()
    }

    fn trie(&self, trie: TrieId) -> Option<&MemTrie> {
        match trie {
            TrieId::Account => Some(&self.accounts),
            TrieId::Storage(owner) => self.storages.get(&owner).map(|t| &**t),
        }
    }
}

impl NodeStore for MemNodeStore {
    type Error = Infallible;

    fn get(&self, trie: TrieId, path: &Nibbles) -> Result<Option<Cow<'_, StoredNode>>, Infallible> {
        Ok(self.trie(trie).and_then(|t| t.get(path)))
    }

    fn get_children(
        &self,
        trie: TrieId,
        path: &Nibbles,
        nibbles: TrieMask,
    ) -> Result<[Option<Cow<'_, StoredNode>>; 16], Infallible> {
        let mut children: [Option<Cow<'_, StoredNode>>; 16] = Default::default();
        if let Some(group) = self.trie(trie).and_then(|t| t.group(path)) {
            for nibble in nibbles.iter() {
                children[usize::from(nibble)] = group.get(nibble).map(Cow::Owned);
            }
        }
        Ok(children)
    }

    fn prefetch_children(&self, trie: TrieId, path: &Nibbles, nibbles: TrieMask) {
        // The lookup itself is the prefetch: made for several siblings in a row, its misses
        // overlap; then the references every update of the branch reads, and the nodes it
        // descends into.
        if let Some(group) = self.trie(trie).and_then(|t| t.group(path)) {
            let children = group.children();
            let refs = group.slots().0;
            prefetch(refs.as_ptr().cast(), size_of_val(refs).div_ceil(64));
            for nibble in nibbles.iter() {
                if let Some(node) = children.node(nibble) {
                    prefetch((node as *const Node).cast(), 2);
                }
            }
        }
    }

    fn get_child_nodes(
        &self,
        trie: TrieId,
        path: &Nibbles,
        nibbles: TrieMask,
    ) -> Result<ChildNodes<'_>, Infallible> {
        if nibbles.is_empty() {
            return Ok(ChildNodes::default());
        }
        Ok(match self.trie(trie).and_then(|t| t.group(path)) {
            Some(group) => {
                let mut children = group.children();
                children.restrict(nibbles);
                children
            }
            None => ChildNodes::default(),
        })
    }

    fn apply(&mut self, updates: &StateTrieUpdates) -> Result<(), Infallible> {
        self.apply_noting(updates, false);
        Ok(())
    }

    fn apply_replacing(
        &mut self,
        updates: &StateTrieUpdates,
    ) -> Result<Option<Replaced>, Infallible> {
        Ok(Some(self.apply_noting(updates, true)))
    }
}

impl MemNodeStore {
    /// Writes `updates`; with `note`, returns what they replaced (otherwise nothing).
    fn apply_noting(&mut self, updates: &StateTrieUpdates, note: bool) -> Replaced {
        let Self { accounts, storages } = self;
        let mut apply_storages = || {
            let mut replaced = B256Map::default();
            let mut wiped = MemNodeStore::default();
            // The tries the batch writes are taken out of the map, so that each can be written
            // on its own thread (a block of many contracts changes hundreds of small tries,
            // each too small to split), and put back after.
            let mut tries = Vec::new();
            let mut changes = 0;
            for (owner, storage) in &updates.storage_tries {
                if storage.wiped
                    && let Some(old) = storages.remove(owner)
                    && note
                {
                    wiped.storages.insert(*owner, old);
                }
                if storage.nodes.is_empty() {
                    continue;
                }
                changes += storage.nodes.write_count() + storage.nodes.deletes().len();
                let trie = storages.remove(owner).unwrap_or_default();
                tries.push((*owner, trie, &storage.nodes));
            }
            let apply = |(_, trie, nodes): &mut (B256, Arc<MemTrie>, &NodeUpdates)| {
                Arc::make_mut(trie).apply_noting(nodes, note)
            };
            let nodes: Vec<ReplacedNodes> = if parallel(changes) {
                tries.par_iter_mut().map(apply).collect()
            } else {
                tries.iter_mut().map(apply).collect()
            };
            for ((owner, trie, _), nodes) in tries.into_iter().zip(nodes) {
                if !trie.is_empty() {
                    storages.insert(owner, trie);
                }
                if note {
                    replaced.insert(owner, nodes);
                }
            }
            (replaced, wiped)
        };
        let (accounts, (storages, wiped)) = if parallel(updates.writes() + updates.deletes()) {
            // The account trie and the storage tries are separate maps: write them side by side.
            rayon::join(
                || accounts.apply_noting(&updates.account_nodes, note),
                apply_storages,
            )
        } else {
            (
                accounts.apply_noting(&updates.account_nodes, note),
                apply_storages(),
            )
        };
        Replaced {
            accounts,
            storages,
            wiped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(v: u8) -> StoredNode {
        StoredNode::new(
            crate::node::Node::Leaf {
                key: Nibbles::from_nibbles([1]),
                value: crate::node::Value::new(&[v]),
            },
            &[],
        )
    }

    /// A leaf, a branch or an extension (by `kind` modulo three), told apart by `v`.
    fn of_kind(kind: u8, v: u8) -> StoredNode {
        let node = match kind % 3 {
            0 => return leaf(v),
            1 => Node::Branch {
                state_mask: TrieMask::new(u16::from(v) | 0b11),
                value: None,
            },
            _ => Node::Extension {
                key: Nibbles::from_nibbles([v & 0xf]),
                child: RlpNode::word_rlp(&B256::repeat_byte(v)),
            },
        };
        StoredNode {
            node,
            reference: RlpNode::word_rlp(&B256::repeat_byte(v)),
        }
    }

    /// A pool of two threads, to apply batches in parallel beside the serial path.
    fn two_workers() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn clone_is_isolated() {
        let mut a = MemNodeStore::new();
        let owner = B256::repeat_byte(7);
        let mut updates = StateTrieUpdates::default();
        updates.account_nodes.push_write(Nibbles::new(), leaf(1));
        updates
            .account_nodes
            .push_write(Nibbles::from_nibbles([3, 4]), leaf(2));
        updates
            .storage_tries
            .entry(owner)
            .or_default()
            .nodes
            .push_write(Nibbles::new(), leaf(3));
        a.apply(&updates).unwrap();

        let b = a.clone();
        let detached = a.detached();
        assert!(
            detached
                .accounts
                .shards
                .iter()
                .zip(&a.accounts.shards)
                .all(|(d, s)| !Arc::ptr_eq(d, s))
        );
        assert!(!Arc::ptr_eq(
            &detached.storages[&owner],
            &a.storages[&owner]
        ));
        for trie in [TrieId::Account, TrieId::Storage(owner)] {
            assert_eq!(detached.nodes(trie), a.nodes(trie));
        }
        let mut change = StateTrieUpdates::default();
        change
            .account_nodes
            .push_delete(Nibbles::from_nibbles([3, 4]));
        change.storage_tries.entry(owner).or_default().wiped = true;
        a.apply(&change).unwrap();

        assert_eq!(
            a.get(TrieId::Account, &Nibbles::from_nibbles([3, 4]))
                .unwrap(),
            None
        );
        assert_eq!(
            a.get(TrieId::Storage(owner), &Nibbles::new()).unwrap(),
            None
        );
        assert_eq!(
            b.get(TrieId::Account, &Nibbles::from_nibbles([3, 4]))
                .unwrap()
                .as_deref(),
            Some(&leaf(2))
        );
        assert_eq!(
            b.get(TrieId::Storage(owner), &Nibbles::new())
                .unwrap()
                .as_deref(),
            Some(&leaf(3))
        );
        assert_eq!(a.len(), 1);
        assert_eq!(b.len(), 3);
        assert_eq!(detached.len(), 3);
        assert!(detached.heap_bytes() > 0);
        assert_eq!(MemNodeStore::new().heap_bytes(), 0);
        assert!(a.storage_owners().is_empty());
    }

    #[test]
    fn wipe_then_write_keeps_only_new_nodes() {
        let mut s = MemNodeStore::new();
        let owner = B256::repeat_byte(1);
        let mut u = StateTrieUpdates::default();
        u.storage_tries
            .entry(owner)
            .or_default()
            .nodes
            .push_write(Nibbles::from_nibbles([5]), leaf(1));
        s.apply(&u).unwrap();
        let mut u = StateTrieUpdates::default();
        let st = u.storage_tries.entry(owner).or_default();
        st.wiped = true;
        st.nodes.push_write(Nibbles::from_nibbles([6]), leaf(2));
        s.apply(&u).unwrap();
        let nodes = s.nodes(TrieId::Storage(owner));
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes.get(&Nibbles::from_nibbles([6])), Some(&leaf(2)));
    }

    #[test]
    fn groups_grow_past_inline_and_shrink_back() {
        // Children of one path written and deleted in an order that moves the group to the
        // heap and back several times; every read agrees with a plain map, and so does what
        // each batch replaced.
        let parent = Nibbles::from_nibbles([2, 7]);
        let child = |n: u8| Nibbles::from_nibbles([2, 7, n]);
        let mut store = MemNodeStore::new();
        let mut model: BTreeMap<u8, StoredNode> = BTreeMap::new();
        let order = [9u8, 3, 15, 0, 7, 12, 1, 14, 2, 5, 4, 6, 8, 10, 11, 13];
        let mut state = 1u32;
        for round in 0..6u8 {
            let mut u = StateTrieUpdates::default();
            let mut before = Vec::new();
            for (i, &n) in order.iter().enumerate() {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let keep = !(state >> 16).is_multiple_of(4) || round.is_multiple_of(2);
                if keep && i.is_multiple_of(usize::from(round + 1)) {
                    let node = of_kind(round + n, round.wrapping_mul(16).wrapping_add(n));
                    u.account_nodes.push_write(child(n), node.clone());
                    before.push((n, model.insert(n, node)));
                } else if let Some(old) = model.remove(&n) {
                    u.account_nodes.push_delete(child(n));
                    before.push((n, Some(old)));
                }
            }
            let replaced = store
                .apply_replacing(&u)
                .unwrap()
                .expect("a memory store takes out what it replaces");
            let mut taken: Vec<_> = replaced.accounts;
            taken.sort_by_key(|(path, _)| *path);
            before.sort_by_key(|(n, _)| *n);
            let before: Vec<_> = before.into_iter().map(|(n, old)| (child(n), old)).collect();
            assert_eq!(taken, before, "round {round}");
            let mask = TrieMask::new(model.keys().fold(0u16, |m, n| m | (1 << n)));
            let nodes = store
                .get_child_nodes(TrieId::Account, &parent, TrieMask::new(u16::MAX))
                .unwrap();
            assert_eq!(nodes.mask(), mask, "round {round}");
            // The kinds the group keeps follow its children as they are rewritten.
            let kind = |f: fn(&Node) -> bool| {
                let bits = model.iter().filter(|(_, s)| f(&s.node));
                TrieMask::new(bits.fold(0u16, |m, (n, _)| m | (1 << n)))
            };
            assert_eq!(
                nodes.branches(),
                kind(|n| matches!(n, Node::Branch { .. })),
                "round {round}"
            );
            assert_eq!(
                nodes.extensions(),
                kind(|n| matches!(n, Node::Extension { .. })),
                "round {round}"
            );
            let children = store
                .get_children(TrieId::Account, &parent, TrieMask::new(u16::MAX))
                .unwrap();
            for n in 0..16u8 {
                let expected = model.get(&n);
                assert_eq!(
                    store.get(TrieId::Account, &child(n)).unwrap().as_deref(),
                    expected
                );
                assert_eq!(children[usize::from(n)].as_deref(), expected);
                assert_eq!(nodes.node(n), expected.map(|s| &s.node));
                assert_eq!(nodes.reference(n), expected.map(|s| &s.reference));
            }
            // Only the nibbles asked for are handed out.
            let some = store
                .get_child_nodes(TrieId::Account, &parent, TrieMask::new(0b1010))
                .unwrap();
            assert_eq!(some.mask().get(), mask.get() & 0b1010);
            assert_eq!(store.len(), model.len());
        }
    }

    #[test]
    fn large_batches_apply_the_same_in_parallel() {
        let mut u = StateTrieUpdates::default();
        for i in 0..5000u32 {
            let path = Nibbles::unpack(i.to_be_bytes());
            u.account_nodes.push_write(path, leaf(i as u8));
            u.storage_tries
                .entry(B256::with_last_byte(1))
                .or_default()
                .nodes
                .push_write(path, leaf(i as u8));
        }
        let mut d = StateTrieUpdates::default();
        for path in u.account_nodes.writes().map(|(p, _)| *p).step_by(2) {
            d.account_nodes.push_delete(path);
        }
        for i in 0..2048u32 {
            d.account_nodes
                .push_delete(Nibbles::unpack((i + 100_000).to_be_bytes()));
        }
        let pool = two_workers();
        let (mut serial, mut parallel) = (MemNodeStore::new(), MemNodeStore::new());
        for batch in [&u, &d] {
            serial.apply(batch).unwrap();
            pool.install(|| parallel.apply(batch)).unwrap();
        }
        assert_eq!(serial.len(), 2500 + 5000);
        assert_eq!(
            serial.nodes(TrieId::Account),
            parallel.nodes(TrieId::Account)
        );
        let owner = TrieId::Storage(B256::with_last_byte(1));
        assert_eq!(serial.nodes(owner), parallel.nodes(owner));
    }

    #[test]
    fn many_storage_tries_apply_the_same_in_parallel() {
        let owners: Vec<B256> = (0..300u16)
            .map(|i| B256::left_padding_from(&i.to_be_bytes()))
            .collect();
        let path = |i: u32| Nibbles::unpack(i.to_be_bytes());
        let mut first = StateTrieUpdates::default();
        for owner in &owners {
            let nodes = &mut first.storage_tries.entry(*owner).or_default().nodes;
            for i in 0..10 {
                nodes.push_write(path(i), leaf(i as u8));
            }
        }
        // A third of the tries wiped and written anew, a third emptied path by path, a third
        // half rewritten.
        let mut second = StateTrieUpdates::default();
        for (n, owner) in owners.iter().enumerate() {
            let storage = second.storage_tries.entry(*owner).or_default();
            for i in 0..10 {
                match n % 3 {
                    0 => {
                        storage.wiped = true;
                        storage.nodes.push_write(path(i + 20), leaf(7));
                    }
                    1 => storage.nodes.push_delete(path(i)),
                    _ if i % 2 == 0 => storage.nodes.push_write(path(i), leaf(9)),
                    _ => {}
                }
            }
        }
        assert!(second.writes() + second.deletes() >= PARALLEL_APPLY_MIN);
        let pool = two_workers();
        let (mut serial, mut parallel) = (MemNodeStore::new(), MemNodeStore::new());
        for batch in [&first, &second] {
            let one = serial.apply_replacing(batch).unwrap().unwrap();
            let other = pool
                .install(|| parallel.apply_replacing(batch))
                .unwrap()
                .unwrap();
            let sorted = |replaced: &Replaced| {
                let storages: BTreeMap<_, _> = replaced.storages.clone().into_iter().collect();
                let wiped: BTreeMap<_, _> = owners
                    .iter()
                    .map(|owner| (*owner, replaced.wiped.nodes(TrieId::Storage(*owner))))
                    .collect();
                (storages, wiped)
            };
            assert_eq!(sorted(&one), sorted(&other));
        }
        for owner in &owners {
            let trie = TrieId::Storage(*owner);
            assert_eq!(serial.nodes(trie), parallel.nodes(trie));
        }
        // The emptied tries are gone from both maps, the others kept.
        assert_eq!(serial.storages.len(), 200);
        assert_eq!(parallel.storages.len(), 200);
    }
}
