//! Trie nodes as they are stored by path, their RLP encoding, and a decoder for stores that
//! persist nodes as bytes.

use alloy_primitives::{B256, keccak256};
use alloy_rlp::{EMPTY_STRING_CODE, Encodable, Header};
use alloy_trie::{
    Nibbles, TrieMask,
    nodes::{BranchNodeRef, ExtensionNodeRef, LeafNodeRef, RlpNode, encode_path_leaf},
};
use std::sync::Arc;

/// One node of a Merkle-Patricia trie, stored under the path (nibbles from the trie root) at
/// which it hangs.
///
/// Children are referenced by their [`RlpNode`]: the 33-byte RLP of the child's hash, or the
/// child's whole RLP when it is shorter than 32 bytes. A branch therefore carries everything
/// needed to re-encode itself when only some of its children changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// Up to sixteen children and, in tries with keys of different lengths, a value.
    Branch {
        /// Which of the sixteen children exist.
        state_mask: TrieMask,
        /// The references of the existing children, in nibble order.
        children: Arc<[RlpNode]>,
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

/// Longest value kept inside the node: the largest account RLP (list header, 9-byte nonce,
/// 33-byte balance, two 33-byte hashes). Keeping every state value inline saves an allocation
/// and a cache miss per leaf touched.
const INLINE_VALUE: usize = 110;

/// A leaf's (or a branch's) value bytes: inline up to 110 bytes, shared on the heap beyond.
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
            Self(ValueRepr::Inline { len: bytes.len() as u8, bytes: inline })
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
        write!(f, "Value(0x{})", alloy_primitives::hex::encode(self.as_slice()))
    }
}

/// Why bytes could not be decoded as a [`Node`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeDecodeError {
    /// The bytes are not valid RLP.
    #[error("invalid RLP: {0}")]
    Rlp(#[from] alloy_rlp::Error),
    /// The RLP list has neither 2 nor 17 items.
    #[error("a trie node has 2 or 17 items, found {0}")]
    ItemCount(usize),
    /// The hex-prefix flag of a short node's key is not one of the four valid values.
    #[error("invalid hex-prefix flag {0:#x}")]
    PathFlag(u8),
    /// A key is longer than the 64 nibbles a path can hold.
    #[error("node key longer than 64 nibbles")]
    KeyTooLong,
    /// A child reference is longer than 33 bytes.
    #[error("child reference longer than 33 bytes")]
    ChildTooLong,
    /// Bytes were left after the node.
    #[error("{0} trailing bytes after the node")]
    Trailing(usize),
}

impl Node {
    /// Appends the node's RLP encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Branch { state_mask, children, value: None } => {
                BranchNodeRef::new(children, *state_mask).encode(out);
            }
            Self::Branch { state_mask, children, value: Some(value) } => {
                encode_branch_with_value(*state_mask, children, value, out);
            }
            Self::Extension { key, child } => ExtensionNodeRef::new(key, child).encode(out),
            Self::Leaf { key, value } => LeafNodeRef::new(key, value).encode(out),
        }
    }

    /// The node's RLP encoding.
    pub fn to_rlp(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// The reference a parent keeps to this node: its RLP when shorter than 32 bytes, otherwise
    /// the RLP of its keccak hash.
    pub fn rlp_node(&self) -> RlpNode {
        RlpNode::from_rlp(&self.to_rlp())
    }

    /// The reference of the child under `nibble` of a branch.
    pub fn branch_child(&self, nibble: u8) -> Option<&RlpNode> {
        match self {
            Self::Branch { state_mask, children, .. } if state_mask.is_bit_set(nibble) => {
                children.get(child_index(*state_mask, nibble))
            }
            _ => None,
        }
    }

    /// Decodes a node from its RLP encoding, the inverse of [`Node::encode`].
    pub fn decode(mut buf: &[u8]) -> Result<Self, NodeDecodeError> {
        let header = Header::decode(&mut buf)?;
        if !header.list {
            return Err(alloy_rlp::Error::UnexpectedString.into());
        }
        if buf.len() != header.payload_length {
            return Err(NodeDecodeError::Trailing(buf.len().saturating_sub(header.payload_length)));
        }
        let mut items: [&[u8]; 17] = [&[]; 17];
        let mut count = 0;
        while !buf.is_empty() {
            let start = buf;
            let item = Header::decode(&mut buf)?;
            if buf.len() < item.payload_length {
                return Err(alloy_rlp::Error::InputTooShort.into());
            }
            buf = &buf[item.payload_length..];
            if count == items.len() {
                return Err(NodeDecodeError::ItemCount(count + 1));
            }
            items[count] = &start[..start.len() - buf.len()];
            count += 1;
        }
        match count {
            17 => {
                let mut state_mask = TrieMask::default();
                let mut children = Vec::with_capacity(16);
                for (nibble, item) in items[..16].iter().enumerate() {
                    if *item != [EMPTY_STRING_CODE] {
                        state_mask.set_bit(nibble as u8);
                        children.push(RlpNode::from_raw(item).ok_or(NodeDecodeError::ChildTooLong)?);
                    }
                }
                let mut value_item = items[16];
                let value = Header::decode_bytes(&mut value_item, false)?;
                let value = (!value.is_empty()).then(|| Value::new(value));
                Ok(Self::Branch { state_mask, children: children.into(), value })
            }
            2 => {
                let mut key_item = items[0];
                let encoded = Header::decode_bytes(&mut key_item, false)?;
                let Some((&flag, rest)) = encoded.split_first() else {
                    return Err(alloy_rlp::Error::InputTooShort.into());
                };
                let (is_leaf, odd) = match flag >> 4 {
                    0 => (false, false),
                    1 => (false, true),
                    2 => (true, false),
                    3 => (true, true),
                    _ => return Err(NodeDecodeError::PathFlag(flag)),
                };
                if !odd && flag & 0x0f != 0 {
                    return Err(NodeDecodeError::PathFlag(flag));
                }
                if rest.len() * 2 + usize::from(odd) > 64 {
                    return Err(NodeDecodeError::KeyTooLong);
                }
                let mut key = Nibbles::new();
                if odd {
                    key.push_unchecked(flag & 0x0f);
                }
                key.extend(&Nibbles::unpack(rest));
                if is_leaf {
                    let mut value_item = items[1];
                    let value = Header::decode_bytes(&mut value_item, false)?;
                    Ok(Self::Leaf { key, value: Value::new(value) })
                } else {
                    let child = RlpNode::from_raw(items[1]).ok_or(NodeDecodeError::ChildTooLong)?;
                    Ok(Self::Extension { key, child })
                }
            }
            n => Err(NodeDecodeError::ItemCount(n)),
        }
    }
}

/// Position of `nibble`'s child in a branch's compact child list.
#[inline]
pub(crate) fn child_index(state_mask: TrieMask, nibble: u8) -> usize {
    (state_mask.get() & ((1u16 << nibble) - 1)).count_ones() as usize
}

/// A branch's RLP when it also carries a value; alloy-trie's encoder has no value slot because
/// state tries never need one, but tries over keys of different lengths (the ethereum/tests
/// vectors) do.
fn encode_branch_with_value(state_mask: TrieMask, children: &[RlpNode], value: &[u8], out: &mut Vec<u8>) {
    let present: usize = children.iter().map(|c| c.len()).sum();
    let payload = present + (16 - children.len()) + value.length();
    Header { list: true, payload_length: payload }.encode(out);
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

/// The hex-prefix encoding of a key, re-exported for stores that encode paths compactly.
pub fn hex_prefix(key: &Nibbles, is_leaf: bool) -> Vec<u8> {
    encode_path_leaf(key, is_leaf).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_trie::nodes::{BranchNode, ExtensionNode, LeafNode, TrieNode};

    fn leaf(key: &[u8], value: &[u8]) -> Node {
        Node::Leaf { key: Nibbles::from_nibbles(key), value: Value::new(value) }
    }

    #[test]
    fn encodings_match_alloy_trie() {
        let l = leaf(&[1, 2, 3], &[0xaa; 40]);
        let alloy = TrieNode::Leaf(LeafNode::new(Nibbles::from_nibbles([1, 2, 3]), vec![0xaa; 40]));
        assert_eq!(l.to_rlp(), alloy_rlp::encode(&alloy));

        let child = l.rlp_node();
        let e = Node::Extension { key: Nibbles::from_nibbles([4, 5]), child: child.clone() };
        let alloy = TrieNode::Extension(ExtensionNode::new(Nibbles::from_nibbles([4, 5]), child.clone()));
        assert_eq!(e.to_rlp(), alloy_rlp::encode(&alloy));

        let small = leaf(&[7], b"x").rlp_node();
        assert!(!small.is_hash());
        let mask = TrieMask::new(0b1000_0000_0000_0101);
        let children: Arc<[RlpNode]> = vec![child.clone(), small.clone(), child.clone()].into();
        let b = Node::Branch { state_mask: mask, children: children.clone(), value: None };
        let alloy = TrieNode::Branch(BranchNode::new(children.to_vec(), mask));
        assert_eq!(b.to_rlp(), alloy_rlp::encode(&alloy));
        assert_eq!(b.branch_child(2), Some(&small));
        assert_eq!(b.branch_child(15), Some(&child));
        assert_eq!(b.branch_child(1), None);
    }

    #[test]
    fn branch_value_encoding_is_a_17_item_list() {
        let child = leaf(&[1], &[0xbb; 40]).rlp_node();
        let b = Node::Branch {
            state_mask: TrieMask::new(0b10),
            children: vec![child.clone()].into(),
            value: Some(Value::new(b"verb")),
        };
        let rlp = b.to_rlp();
        // Hand-built: 16 child slots (one hash, fifteen empty) then the value string.
        let mut expected_payload = vec![EMPTY_STRING_CODE];
        expected_payload.extend_from_slice(&child);
        expected_payload.extend(std::iter::repeat_n(EMPTY_STRING_CODE, 14));
        expected_payload.extend_from_slice(&[0x84, b'v', b'e', b'r', b'b']);
        let mut expected = Vec::new();
        Header { list: true, payload_length: expected_payload.len() }.encode(&mut expected);
        expected.extend_from_slice(&expected_payload);
        assert_eq!(rlp, expected);
        assert_eq!(Node::decode(&rlp).unwrap(), b);
    }

    #[test]
    fn values_inline_and_on_heap() {
        let small = Value::new(&[7; 110]);
        let big = Value::new(&[8; 111]);
        assert!(matches!(small.0, ValueRepr::Inline { len: 110, .. }));
        assert!(matches!(big.0, ValueRepr::Heap(_)));
        assert_eq!(&*small, &[7; 110][..]);
        assert_eq!(&*big, &[8; 111][..]);
        let l = leaf(&[1], &[9; 300]);
        assert_eq!(Node::decode(&l.to_rlp()).unwrap(), l);
    }

    #[test]
    fn decode_round_trips() {
        let l = leaf(&[1, 2, 3], &[0xaa; 40]);
        let even = leaf(&[1, 2, 3, 4], b"v");
        let empty_key = leaf(&[], b"v");
        let e = Node::Extension { key: Nibbles::from_nibbles([4]), child: l.rlp_node() };
        let b = Node::Branch {
            state_mask: TrieMask::new(0b11),
            children: vec![l.rlp_node(), even.rlp_node()].into(),
            value: None,
        };
        for node in [l, even, empty_key, e, b] {
            assert_eq!(Node::decode(&node.to_rlp()).unwrap(), node);
        }
    }

    #[test]
    fn decode_rejects_garbage() {
        assert!(Node::decode(&[]).is_err());
        assert!(Node::decode(&[0x80]).is_err());
        assert!(Node::decode(&[0xc3, 0x80, 0x80, 0x80]).is_err());
        // Leaf with flag 0x4 is invalid.
        assert!(Node::decode(&[0xc4, 0x81, 0x40, 0x81, 0x01]).is_err());
        // Trailing byte.
        let mut rlp = leaf(&[1], b"v").to_rlp();
        rlp.push(0);
        assert!(Node::decode(&rlp).is_err());
    }
}
