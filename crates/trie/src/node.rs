//! Trie nodes as they are stored by path, their RLP encoding, and a byte codec for stores that
//! persist them.

use alloy_primitives::{B256, keccak256};
use alloy_rlp::{EMPTY_STRING_CODE, Encodable, Header};
use alloy_trie::{
    Nibbles, TrieMask,
    nodes::{BranchNodeRef, ExtensionNodeRef, LeafNodeRef, RlpNode},
};
use std::sync::Arc;

/// One node of a Merkle-Patricia trie, stored under the path (nibbles from the trie root) at
/// which it hangs.
///
/// A branch does not repeat its children's references: each child, stored at the branch's
/// path plus its nibble, carries its own ([`StoredNode::reference`]), so a block that changes
/// one child rewrites that child and the branch's mask-and-value record, never an array of
/// sixteen references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// Up to sixteen children and, in tries with keys of different lengths, a value.
    Branch {
        /// Which of the sixteen children exist.
        state_mask: TrieMask,
        /// The value of the key that ends at this branch. Always `None` in state tries.
        value: Option<Value>,
    },
    /// A shared run of nibbles leading to one branch.
    Extension {
        /// The shared nibbles.
        key: Nibbles,
        /// The branch's reference.
        child: RlpNode,
    },
    /// The rest of a key and its value.
    Leaf {
        /// The nibbles of the key below this node's path.
        key: Nibbles,
        /// The value (for state tries: the RLP of the account or of the storage slot).
        value: Value,
    },
}

/// What a store keeps at a path: the node and the reference its parent holds for it (the
/// node's RLP when shorter than 32 bytes, otherwise the RLP of its keccak hash). The
/// reference is the node's cached hash: it changes only when the node is rewritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredNode {
    /// The node.
    pub node: Node,
    /// Its reference.
    pub reference: RlpNode,
}

/// Longest value kept inside the node. Covers every storage value and any account whose
/// nonce fits 4 bytes and balance 12 (all of mainnet); longer ones go to the heap. Inline values
/// save an allocation and a cache miss per leaf touched.
const INLINE_VALUE: usize = 86;

/// A leaf's (or a branch's) value bytes: inline up to 86 bytes, shared on the heap beyond.
#[derive(Clone)]
pub struct Value(ValueRepr);

#[derive(Clone)]
enum ValueRepr {
    Inline { len: u8, bytes: [u8; INLINE_VALUE] },
    Heap(Arc<[u8]>),
}

impl Value {
    /// A value holding a copy of `bytes`.
    pub fn new(bytes: &[u8]) -> Self {
        if bytes.len() <= INLINE_VALUE {
            let mut inline = [0u8; INLINE_VALUE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Self(ValueRepr::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            })
        } else {
            Self(ValueRepr::Heap(Arc::from(bytes)))
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            ValueRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            ValueRepr::Heap(bytes) => bytes,
        }
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Value {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<&[u8]> for Value {
    fn from(bytes: &[u8]) -> Self {
        Self::new(bytes)
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Value {}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Value(0x{})",
            alloy_primitives::hex::encode(self.as_slice())
        )
    }
}

/// Why bytes could not be decoded as a [`StoredNode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeDecodeError {
    /// The bytes end before the node does.
    #[error("node bytes end early")]
    Truncated,
    /// The first byte names no node kind.
    #[error("unknown node kind {0}")]
    Kind(u8),
    /// A length field is out of range.
    #[error("invalid length {0}")]
    Length(usize),
    /// Bytes were left after the node.
    #[error("{0} trailing bytes after the node")]
    Trailing(usize),
}

impl Node {
    /// Appends the node's RLP encoding to `out`. A branch needs the references of its
    /// children, in nibble order; other nodes ignore `children`.
    pub fn encode(&self, children: &[RlpNode], out: &mut Vec<u8>) {
        match self {
            Self::Branch {
                state_mask,
                value: None,
            } => BranchNodeRef::new(children, *state_mask).encode(out),
            Self::Branch {
                state_mask,
                value: Some(value),
            } => encode_branch_with_value(*state_mask, children, value, out),
            Self::Extension { key, child } => ExtensionNodeRef::new(key, child).encode(out),
            Self::Leaf { key, value } => LeafNodeRef::new(key, value).encode(out),
        }
    }

    /// The reference a parent keeps to this node (see [`StoredNode::reference`]).
    pub fn reference(&self, children: &[RlpNode]) -> RlpNode {
        let mut rlp = Vec::new();
        self.encode(children, &mut rlp);
        RlpNode::from_rlp(&rlp)
    }
}

const KIND_BRANCH: u8 = 0;
const KIND_EXTENSION: u8 = 1;
const KIND_LEAF: u8 = 2;

fn put_nibbles(key: &Nibbles, out: &mut Vec<u8>) {
    out.push(key.len() as u8);
    out.extend_from_slice(&key.pack());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], NodeDecodeError> {
        if self.0.len() < n {
            return Err(NodeDecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, NodeDecodeError> {
        Ok(self.take(1)?[0])
    }

    fn nibbles(&mut self) -> Result<Nibbles, NodeDecodeError> {
        let len = usize::from(self.byte()?);
        if len > 64 {
            return Err(NodeDecodeError::Length(len));
        }
        let packed = self.take(len.div_ceil(2))?;
        Ok(Nibbles::unpack(packed).slice(..len))
    }

    fn reference(&mut self) -> Result<RlpNode, NodeDecodeError> {
        let len = usize::from(self.byte()?);
        RlpNode::from_raw(self.take(len)?).ok_or(NodeDecodeError::Length(len))
    }

    fn value(&mut self) -> Result<Value, NodeDecodeError> {
        let len = u32::from_be_bytes(
            self.take(4)?
                .try_into()
                .map_err(|_| NodeDecodeError::Truncated)?,
        );
        Ok(Value::new(self.take(len as usize)?))
    }
}

impl StoredNode {
    /// A node with the reference computed from its encoding (and, for a branch, its
    /// children's references).
    pub fn new(node: Node, children: &[RlpNode]) -> Self {
        let reference = node.reference(children);
        Self { node, reference }
    }

    /// A compact byte form for stores that persist nodes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        let put_value = |value: &Value, out: &mut Vec<u8>| {
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        };
        match &self.node {
            Node::Branch { state_mask, value } => {
                out.push(KIND_BRANCH);
                out.extend_from_slice(&state_mask.get().to_be_bytes());
                match value {
                    Some(value) => {
                        out.push(1);
                        put_value(value, &mut out);
                    }
                    None => out.push(0),
                }
            }
            Node::Extension { key, child } => {
                out.push(KIND_EXTENSION);
                put_nibbles(key, &mut out);
                out.push(child.len() as u8);
                out.extend_from_slice(child);
            }
            Node::Leaf { key, value } => {
                out.push(KIND_LEAF);
                put_nibbles(key, &mut out);
                put_value(value, &mut out);
            }
        }
        out.push(self.reference.len() as u8);
        out.extend_from_slice(&self.reference);
        out
    }

    /// Decodes [`StoredNode::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, NodeDecodeError> {
        let mut r = Reader(bytes);
        let node = match r.byte()? {
            KIND_BRANCH => {
                let mask = r.take(2)?;
                let state_mask = TrieMask::new(u16::from_be_bytes([mask[0], mask[1]]));
                let value = match r.byte()? {
                    0 => None,
                    1 => Some(r.value()?),
                    other => return Err(NodeDecodeError::Length(usize::from(other))),
                };
                Node::Branch { state_mask, value }
            }
            KIND_EXTENSION => Node::Extension {
                key: r.nibbles()?,
                child: r.reference()?,
            },
            KIND_LEAF => Node::Leaf {
                key: r.nibbles()?,
                value: r.value()?,
            },
            other => return Err(NodeDecodeError::Kind(other)),
        };
        let reference = r.reference()?;
        if !r.0.is_empty() {
            return Err(NodeDecodeError::Trailing(r.0.len()));
        }
        Ok(Self { node, reference })
    }
}

/// Position of `nibble`'s child among the children in `state_mask`.
#[inline]
pub(crate) fn child_index(state_mask: TrieMask, nibble: u8) -> usize {
    (state_mask.get() & ((1u16 << nibble) - 1)).count_ones() as usize
}

/// A branch's RLP when it also carries a value; alloy-trie's encoder has no value slot because
/// state tries never need one, but tries over keys of different lengths (the ethereum/tests
/// vectors) do.
fn encode_branch_with_value(
    state_mask: TrieMask,
    children: &[RlpNode],
    value: &[u8],
    out: &mut Vec<u8>,
) {
    let present: usize = children.iter().map(|c| c.len()).sum();
    let payload = present + (16 - children.len()) + value.length();
    Header {
        list: true,
        payload_length: payload,
    }
    .encode(out);
    let mut next = children.iter();
    for nibble in 0..16u8 {
        match state_mask.is_bit_set(nibble).then(|| next.next()).flatten() {
            Some(child) => out.extend_from_slice(child),
            None => out.push(EMPTY_STRING_CODE),
        }
    }
    value.encode(out);
}

/// The reference to a node whose RLP is `rlp`, counting the keccak when one is taken.
#[inline]
pub(crate) fn rlp_node_counted(rlp: &[u8], keccak_calls: &mut u64) -> RlpNode {
    if rlp.len() < 32 {
        // Cannot fail: the slice is shorter than the 33-byte capacity.
        RlpNode::from_raw(rlp).unwrap_or_default()
    } else {
        *keccak_calls += 1;
        RlpNode::word_rlp(&keccak256(rlp))
    }
}

/// The hash of a trie whose root node has reference `root`: a root shorter than 32 bytes is
/// still hashed, as every root is.
#[inline]
pub(crate) fn root_hash_of(root: &RlpNode, keccak_calls: &mut u64) -> B256 {
    match root.as_hash() {
        Some(hash) => hash,
        None => {
            *keccak_calls += 1;
            keccak256(root.as_slice())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_trie::nodes::{BranchNode, ExtensionNode, LeafNode, TrieNode};

    fn leaf(key: &[u8], value: &[u8]) -> Node {
        Node::Leaf {
            key: Nibbles::from_nibbles(key),
            value: Value::new(value),
        }
    }

    fn rlp(node: &Node, children: &[RlpNode]) -> Vec<u8> {
        let mut out = Vec::new();
        node.encode(children, &mut out);
        out
    }

    #[test]
    fn encodings_match_alloy_trie() {
        let l = leaf(&[1, 2, 3], &[0xaa; 40]);
        let alloy = TrieNode::Leaf(LeafNode::new(
            Nibbles::from_nibbles([1, 2, 3]),
            vec![0xaa; 40],
        ));
        assert_eq!(rlp(&l, &[]), alloy_rlp::encode(&alloy));

        let child = l.reference(&[]);
        assert!(child.is_hash());
        let e = Node::Extension {
            key: Nibbles::from_nibbles([4, 5]),
            child: child.clone(),
        };
        let alloy = TrieNode::Extension(ExtensionNode::new(
            Nibbles::from_nibbles([4, 5]),
            child.clone(),
        ));
        assert_eq!(rlp(&e, &[]), alloy_rlp::encode(&alloy));

        let small = leaf(&[7], b"x").reference(&[]);
        assert!(!small.is_hash());
        let mask = TrieMask::new(0b1000_0000_0000_0101);
        let children = vec![child.clone(), small, child];
        let b = Node::Branch {
            state_mask: mask,
            value: None,
        };
        let alloy = TrieNode::Branch(BranchNode::new(children.clone(), mask));
        assert_eq!(rlp(&b, &children), alloy_rlp::encode(&alloy));
        assert_eq!(child_index(mask, 2), 1);
        assert_eq!(child_index(mask, 15), 2);
    }

    #[test]
    fn branch_value_encoding_is_a_17_item_list() {
        let child = leaf(&[1], &[0xbb; 40]).reference(&[]);
        let b = Node::Branch {
            state_mask: TrieMask::new(0b10),
            value: Some(Value::new(b"verb")),
        };
        // Hand-built: 16 child slots (one hash, fifteen empty) then the value string.
        let mut expected_payload = vec![EMPTY_STRING_CODE];
        expected_payload.extend_from_slice(&child);
        expected_payload.extend(std::iter::repeat_n(EMPTY_STRING_CODE, 14));
        expected_payload.extend_from_slice(&[0x84, b'v', b'e', b'r', b'b']);
        let mut expected = Vec::new();
        Header {
            list: true,
            payload_length: expected_payload.len(),
        }
        .encode(&mut expected);
        expected.extend_from_slice(&expected_payload);
        assert_eq!(rlp(&b, &[child]), expected);
    }

    #[test]
    fn values_inline_and_on_heap() {
        let small = Value::new(&[7; INLINE_VALUE]);
        let big = Value::new(&[8; INLINE_VALUE + 1]);
        assert!(matches!(small.0, ValueRepr::Inline { .. }));
        assert!(matches!(big.0, ValueRepr::Heap(_)));
        assert_eq!(&*small, &[7; INLINE_VALUE][..]);
        assert_eq!(&*big, &[8; INLINE_VALUE + 1][..]);
    }

    #[test]
    fn codec_round_trips() {
        let l = leaf(&[1, 2, 3], &[0xaa; 40]);
        let nodes = [
            StoredNode::new(l.clone(), &[]),
            StoredNode::new(leaf(&[1, 2, 3, 4], b"v"), &[]),
            StoredNode::new(leaf(&[], &[9; 300]), &[]),
            StoredNode::new(
                Node::Extension {
                    key: Nibbles::from_nibbles([4]),
                    child: l.reference(&[]),
                },
                &[],
            ),
            StoredNode::new(
                Node::Branch {
                    state_mask: TrieMask::new(0b11),
                    value: None,
                },
                &[l.reference(&[]), l.reference(&[])],
            ),
            StoredNode::new(
                Node::Branch {
                    state_mask: TrieMask::new(0b1),
                    value: Some(Value::new(b"x")),
                },
                &[l.reference(&[])],
            ),
        ];
        for node in nodes {
            assert_eq!(StoredNode::from_bytes(&node.to_bytes()).unwrap(), node);
        }
    }

    #[test]
    fn codec_rejects_garbage() {
        assert_eq!(StoredNode::from_bytes(&[]), Err(NodeDecodeError::Truncated));
        assert_eq!(StoredNode::from_bytes(&[9]), Err(NodeDecodeError::Kind(9)));
        assert_eq!(
            StoredNode::from_bytes(&[KIND_LEAF, 65]),
            Err(NodeDecodeError::Length(65))
        );
        let mut bytes = StoredNode::new(leaf(&[1], b"v"), &[]).to_bytes();
        bytes.push(0);
        assert_eq!(
            StoredNode::from_bytes(&bytes),
            Err(NodeDecodeError::Trailing(1))
        );
        bytes.truncate(bytes.len() - 3);
        assert_eq!(
            StoredNode::from_bytes(&bytes),
            Err(NodeDecodeError::Truncated)
        );
    }
}
