//! Dependency hints known before execution: from each transaction's sender, recipient and
//! value, and from the decoded calldata of ERC20 `transfer`/`transferFrom`/`approve` and Uniswap
//! V2 `swapExactTokensForTokens`. They only steer scheduling (which transaction waits for
//! which); a wrong or missing hint costs a re-execution, never correctness.

use super::mv::TxIdx;
use alloy_consensus::{Transaction, TxEnvelope, transaction::Recovered};
use alloy_primitives::{
    Address, Bytes, TxKind, U256,
    map::{DefaultHashBuilder, HashMap},
};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// A conflict key. ERC20 slots are keyed by (token, owner[, spender]) rather than by the
/// keccak slot the contract uses: the key only has to be equal exactly when the slot is, and
/// skipping two or three keccaks per transaction keeps hinting cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HintKey {
    /// Nonce and balance of an account.
    Account(Address),
    /// `balances[owner]` of a token (OpenZeppelin layout: mapping at slot 0).
    Balance { token: Address, owner: Address },
    /// `allowances[owner][spender]` of a token (mapping at slot 1).
    Allowance {
        token: Address,
        owner: Address,
        spender: Address,
    },
    /// The reserves (and token balances) of the Uniswap V2 pair of two tokens.
    Pair(Address, Address),
    /// Storage of a contract called with calldata we cannot decode.
    Contract(Address),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reads and writes the value: ordered after every earlier access.
    Strict,
    /// Only adds to a balance (a lazy increment): needs no order among its kind.
    Additive,
}

const TRANSFER: [u8; 4] = [0xa9, 0x05, 0x9c, 0xbb];
const TRANSFER_FROM: [u8; 4] = [0x23, 0xb8, 0x72, 0xdd];
const APPROVE: [u8; 4] = [0x09, 0x5e, 0xa7, 0xb3];
const SWAP_EXACT_TOKENS_FOR_TOKENS: [u8; 4] = [0x38, 0xed, 0x17, 0x39];

/// Hints of a whole block.
#[derive(Debug, Default)]
pub(crate) struct BlockHints {
    /// Earlier transactions each transaction should wait for before it runs.
    pub deps: Vec<Vec<TxIdx>>,
    /// The recipient whose balance a transaction may credit lazily (a plain transfer to a hot
    /// recipient), if any.
    pub lazy_recipient: Vec<Option<Address>>,
    /// Whether a transaction's speculative writes are worth publishing to the multi-version
    /// memory: some later transaction is hinted to depend on it, it credits lazily (a later
    /// reader must see every credit), or it calls code whose writes the hints cannot tell.
    /// The writes of the others would only be read by a transaction the hints missed, whose
    /// stale read the committer catches anyway; publishing them costs about a microsecond a
    /// transaction.
    pub publish: Vec<bool>,
    /// Length of the longest chain of hinted dependencies (transactions that must run one
    /// after the other).
    pub longest_chain: usize,
}

fn word(input: &Bytes, index: usize) -> Option<&[u8]> {
    input.get(4 + 32 * index..4 + 32 * (index + 1))
}

fn address_arg(input: &Bytes, index: usize) -> Option<Address> {
    word(input, index).map(|w| Address::from_slice(&w[12..]))
}

fn usize_arg(input: &Bytes, index: usize) -> Option<usize> {
    let w = word(input, index)?;
    let v = U256::from_be_slice(w);
    (v < U256::from(1u64 << 32)).then(|| v.to::<usize>())
}

/// The token path of `swapExactTokensForTokens(amountIn, amountOutMin, path, to, deadline)`.
fn swap_path(input: &Bytes) -> Option<Vec<Address>> {
    let offset = usize_arg(input, 2)?;
    let len_word = input.get(4 + offset..4 + offset + 32)?;
    let len = U256::from_be_slice(len_word);
    if len > U256::from(8) {
        return None;
    }
    (0..len.to::<usize>())
        .map(|i| {
            let start = 4 + offset + 32 + 32 * i;
            input.get(start + 12..start + 32).map(Address::from_slice)
        })
        .collect()
}

fn sorted(a: Address, b: Address) -> (Address, Address) {
    if a <= b { (a, b) } else { (b, a) }
}

/// The keys a transaction touches, with its lazily credited recipient.
fn tx_keys(
    tx: &Recovered<TxEnvelope>,
    hot: &HashMap<Address, u32>,
    lazy_recipients: bool,
    keys: &mut Vec<(HintKey, Mode)>,
) -> Option<Address> {
    let sender = tx.signer();
    keys.push((HintKey::Account(sender), Mode::Strict));
    let TxKind::Call(to) = tx.kind() else {
        return None;
    };
    let input = tx.input();
    if input.is_empty() || input.len() < 4 {
        // A plain transfer (or a call of a contract's fallback).
        if is_lazy_candidate(tx, to, hot, lazy_recipients) {
            keys.push((HintKey::Account(to), Mode::Additive));
            return Some(to);
        }
        keys.push((HintKey::Account(to), Mode::Strict));
        return None;
    }
    if !tx.value().is_zero() {
        keys.push((HintKey::Account(to), Mode::Strict));
    }
    let selector: [u8; 4] = input[..4].try_into().unwrap_or_default();
    let balance = |owner| (HintKey::Balance { token: to, owner }, Mode::Strict);
    match selector {
        TRANSFER if input.len() >= 68 => {
            keys.push(balance(sender));
            keys.extend(address_arg(input, 0).map(balance));
        }
        TRANSFER_FROM if input.len() >= 100 => {
            if let (Some(from), Some(recipient)) = (address_arg(input, 0), address_arg(input, 1)) {
                keys.push(balance(from));
                keys.push(balance(recipient));
                keys.push((
                    HintKey::Allowance {
                        token: to,
                        owner: from,
                        spender: sender,
                    },
                    Mode::Strict,
                ));
            }
        }
        APPROVE if input.len() >= 68 => {
            if let Some(spender) = address_arg(input, 0) {
                keys.push((
                    HintKey::Allowance {
                        token: to,
                        owner: sender,
                        spender,
                    },
                    Mode::Strict,
                ));
            }
        }
        SWAP_EXACT_TOKENS_FOR_TOKENS => match (swap_path(input), address_arg(input, 3)) {
            (Some(path), Some(recipient)) if path.len() >= 2 => {
                let first = path[0];
                keys.push((
                    HintKey::Balance {
                        token: first,
                        owner: sender,
                    },
                    Mode::Strict,
                ));
                keys.push((
                    HintKey::Allowance {
                        token: first,
                        owner: sender,
                        spender: to,
                    },
                    Mode::Strict,
                ));
                for pair in path.windows(2) {
                    let (a, b) = sorted(pair[0], pair[1]);
                    keys.push((HintKey::Pair(a, b), Mode::Strict));
                }
                let last = path[path.len() - 1];
                keys.push((
                    HintKey::Balance {
                        token: last,
                        owner: recipient,
                    },
                    Mode::Strict,
                ));
            }
            _ => keys.push((HintKey::Contract(to), Mode::Strict)),
        },
        _ => keys.push((HintKey::Contract(to), Mode::Strict)),
    }
    None
}

fn is_lazy_candidate(
    tx: &Recovered<TxEnvelope>,
    to: Address,
    hot: &HashMap<Address, u32>,
    lazy_recipients: bool,
) -> bool {
    lazy_recipients
        && !tx.value().is_zero()
        && to != tx.signer()
        && tx.authorization_list().is_none_or(|l| l.is_empty())
        && hot.get(&to).is_some_and(|n| *n >= 2)
        // Precompiles live at low addresses and run code although they have none.
        && to.0[..18].iter().any(|b| *b != 0)
}

/// Builds the hints of a block. `coinbase` never becomes a lazy recipient: its balance is
/// handled by the deferred fee instead.
pub(crate) fn build(
    txs: &[Recovered<TxEnvelope>],
    coinbase: Address,
    lazy_recipients: bool,
) -> BlockHints {
    // Recipients of plain value transfers, counted: two or more in a block make one hot.
    let mut hot: HashMap<Address, u32> = HashMap::default();
    if lazy_recipients {
        hot.reserve(txs.len());
        for tx in txs {
            if let TxKind::Call(to) = tx.kind()
                && tx.input().is_empty()
                && !tx.value().is_zero()
                && to != coinbase
            {
                *hot.entry(to).or_default() += 1;
            }
        }
    }
    // (last strict access, last access of any mode) per key, `NONE` for none. Keys are
    // replaced by a seeded 64-bit hash of them: the table stays small enough for the cache, and
    // a collision only adds a needless dependency (hints steer, they never decide).
    const NONE: TxIdx = TxIdx::MAX;
    let seed = DefaultHashBuilder::default();
    let mut last: HashMap<u64, (TxIdx, TxIdx), BuildHasherDefault<PreHashed>> =
        HashMap::with_capacity_and_hasher(txs.len() * 3, Default::default());
    let mut hints = BlockHints {
        deps: Vec::with_capacity(txs.len()),
        lazy_recipient: Vec::with_capacity(txs.len()),
        publish: Vec::with_capacity(txs.len()),
        longest_chain: 0,
    };
    let mut keys = Vec::new();
    // Length of the longest dependency chain ending at each transaction.
    let mut depth: Vec<u32> = Vec::with_capacity(txs.len());
    for (j, tx) in txs.iter().enumerate() {
        let j = j as TxIdx;
        keys.clear();
        let lazy = tx_keys(tx, &hot, lazy_recipients, &mut keys);
        let opaque = keys
            .iter()
            .any(|(key, mode)| *mode == Mode::Additive || matches!(key, HintKey::Contract(_)));
        let mut deps: Vec<TxIdx> = Vec::new();
        for (key, mode) in &keys {
            let entry = last.entry(seed.hash_one(key)).or_insert((NONE, NONE));
            match mode {
                Mode::Strict => {
                    deps.extend(Some(entry.1).filter(|&p| p != NONE));
                    *entry = (j, j);
                }
                Mode::Additive => {
                    deps.extend(Some(entry.0).filter(|&p| p != NONE));
                    entry.1 = j;
                }
            }
        }
        // A transaction touching one key twice (a transfer to itself) must not wait for itself.
        deps.retain(|&p| p != j);
        deps.sort_unstable();
        deps.dedup();
        let d = 1 + deps.iter().map(|&p| depth[p as usize]).max().unwrap_or(0);
        depth.push(d);
        hints.longest_chain = hints.longest_chain.max(d as usize);
        for &p in &deps {
            hints.publish[p as usize] = true;
        }
        hints.deps.push(deps);
        hints.lazy_recipient.push(lazy);
        hints.publish.push(opaque);
    }
    hints
}

/// Hasher for keys that already are hashes: passes the `u64` through.
#[derive(Debug, Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is expected; fold anything else in rather than lose it.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(29) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}
