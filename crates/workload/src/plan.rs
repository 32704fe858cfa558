//! Chooses every transaction (sender, nonce, call) before anything is signed, so the genesis
//! can be funded for exactly what the blocks do and signing can run in parallel.

use crate::{HOT_ACCOUNT, HOT_SENDERS, WorkloadConfig, WorkloadKind};
use alloy_primitives::{U256, keccak256};
use rand_chacha::{
    ChaCha8Rng,
    rand_core::{RngCore, SeedableRng},
};

/// A seeded random stream. Only `next_u64` of ChaCha8 is used (no `rand` distributions), so
/// the sequence is fixed by the algorithm, not by a library version.
pub(crate) struct Rng(ChaCha8Rng);

impl Rng {
    pub(crate) fn new(seed: u64, label: &str) -> Self {
        let mut preimage = label.as_bytes().to_vec();
        preimage.extend_from_slice(&seed.to_be_bytes());
        Self(ChaCha8Rng::from_seed(keccak256(preimage).0))
    }

    /// Uniform in `0..n` (multiply-shift; the bias is below 2^-32 for any n we use).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.0.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: u128, hi: u128) -> U256 {
        let span = hi - lo + 1;
        let wide = (u128::from(self.0.next_u64()) << 64) | u128::from(self.0.next_u64());
        U256::from(lo + wide % span)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        // 53 random bits as a float in [0, 1).
        ((self.0.next_u64() >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < p
    }
}

const GWEI: u128 = 1_000_000_000;
const ETHER: u128 = GWEI * GWEI;
/// ETH transfers send 1e-6 to 1e-3 ether.
const ETH_VALUE: (u128, u128) = (ETHER / 1_000_000, ETHER / 1_000);
/// ERC20 transfers move 0.001 to 1 token (18 decimals).
const TOKEN_AMOUNT: (u128, u128) = (ETHER / 1_000, ETHER);
/// Swaps pay in 0.01 to 10 tokens, against a million-token reserve.
const SWAP_AMOUNT: (u128, u128) = (ETHER / 100, 10 * ETHER);
/// Of every hundred exchange transactions, this many are withdrawals from the hot wallet...
const EXCHANGE_WITHDRAWALS: u64 = 1;
/// ...and this many deposits into it.
const EXCHANGE_DEPOSITS: u64 = 10;
/// Compute calls run 2,000 to 10,000 rounds.
const COMPUTE_ROUNDS: (u64, u64) = (2_000, 10_000);

/// What one transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send `value` wei to account `to`.
    Eth { to: u32, value: U256 },
    /// `transfer(account to, amount)` on the main token.
    Erc20 { to: u32, amount: U256 },
    /// `approve(account spender, amount)` on the main token.
    Approve { spender: u32, amount: U256 },
    /// `transferFrom(account from, account to, amount)` on the main token, sent by a spender
    /// that `from` approved for exactly `amount` earlier.
    TransferFrom { from: u32, to: u32, amount: U256 },
    /// Swap `amount_in` of the pair's token0 (or token1) for the other one, to the sender.
    Swap {
        pair: u32,
        token0_in: bool,
        amount_in: U256,
    },
    /// Call the compute contract for `rounds` rounds.
    Compute { rounds: u32 },
}

/// One transaction before signing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedTx {
    pub(crate) sender: u32,
    pub(crate) nonce: u64,
    pub(crate) action: Action,
}

/// Picks senders: hot ones with probability `skew`, otherwise walks a seeded permutation of
/// the cold accounts, so no cold account sends twice before every cold account has sent once.
/// That keeps same-sender (nonce) dependencies at exactly what `sender_skew` asks for.
struct Senders {
    cold: Vec<u32>,
    next: usize,
    skew: f64,
}

impl Senders {
    fn new(rng: &mut Rng, accounts: usize, skew: f64, total: usize) -> Self {
        let first_cold = (HOT_ACCOUNT + 1) as u32;
        let mut cold: Vec<u32> = (first_cold..accounts as u32).collect();
        // A partial Fisher-Yates: only the prefix the walk will reach needs shuffling.
        let steps = total.min(cold.len());
        for i in 0..steps {
            let j = i + rng.below((cold.len() - i) as u64) as usize;
            cold.swap(i, j);
        }
        Self {
            cold,
            next: 0,
            skew,
        }
    }

    fn pick(&mut self, rng: &mut Rng) -> u32 {
        if rng.chance(self.skew) {
            return rng.below(HOT_SENDERS as u64) as u32;
        }
        let sender = self.cold[self.next];
        self.next = (self.next + 1) % self.cold.len();
        sender
    }
}

/// A uniformly random account other than every one in `exclude`.
fn recipient(rng: &mut Rng, accounts: usize, exclude: &[u32]) -> u32 {
    loop {
        let r = rng.below(accounts as u64) as u32;
        if !exclude.contains(&r) {
            return r;
        }
    }
}

/// The transactions of every block, in order.
pub(crate) fn plan(cfg: &WorkloadConfig) -> Vec<Vec<PlannedTx>> {
    let mut rng = Rng::new(cfg.seed, "overdrive-workload plan");
    let total = cfg.txs_per_block * cfg.blocks;
    let n = cfg.accounts;
    let mut senders = Senders::new(&mut rng, n, cfg.sender_skew, total);
    let mut nonces = vec![0u64; n];
    // The chain's current holder: the first sender of the chained workload.
    let mut holder = senders.cold[0];
    let hot = HOT_ACCOUNT as u32;
    let pairs = cfg.pairs as u64;
    // Allowance: approvals not spent yet, as (owner, spender, amount).
    let mut open: Vec<(u32, u32, U256)> = Vec::new();

    let mut blocks = Vec::with_capacity(cfg.blocks);
    for _ in 0..cfg.blocks {
        let mut txs = Vec::with_capacity(cfg.txs_per_block);
        for _ in 0..cfg.txs_per_block {
            let (sender, action) = match cfg.kind {
                WorkloadKind::Transfer => {
                    let sender = senders.pick(&mut rng);
                    let to = recipient(&mut rng, n, &[sender]);
                    (
                        sender,
                        Action::Eth {
                            to,
                            value: rng.between(ETH_VALUE.0, ETH_VALUE.1),
                        },
                    )
                }
                WorkloadKind::Erc20 => {
                    let sender = senders.pick(&mut rng);
                    let to = recipient(&mut rng, n, &[sender]);
                    (
                        sender,
                        Action::Erc20 {
                            to,
                            amount: rng.between(TOKEN_AMOUNT.0, TOKEN_AMOUNT.1),
                        },
                    )
                }
                WorkloadKind::Uniswap | WorkloadKind::Router => {
                    let sender = senders.pick(&mut rng);
                    let pair = rng.below(pairs) as u32;
                    (sender, swap(&mut rng, pair))
                }
                WorkloadKind::Chained => {
                    let sender = holder;
                    let to = recipient(&mut rng, n, &[sender]);
                    holder = to;
                    (
                        sender,
                        Action::Erc20 {
                            to,
                            amount: rng.between(TOKEN_AMOUNT.0, TOKEN_AMOUNT.1),
                        },
                    )
                }
                WorkloadKind::Allowance => allowance(&mut rng, &mut senders, n, &mut open),
                WorkloadKind::Exchange => {
                    let value = rng.between(ETH_VALUE.0, ETH_VALUE.1);
                    let draw = rng.below(100);
                    if draw < EXCHANGE_WITHDRAWALS {
                        let to = recipient(&mut rng, n, &[hot]);
                        (hot, Action::Eth { to, value })
                    } else {
                        let sender = senders.pick(&mut rng);
                        let to = if draw < EXCHANGE_WITHDRAWALS + EXCHANGE_DEPOSITS {
                            hot
                        } else {
                            recipient(&mut rng, n, &[sender, hot])
                        };
                        (sender, Action::Eth { to, value })
                    }
                }
                WorkloadKind::Compute => {
                    let sender = senders.pick(&mut rng);
                    let span = COMPUTE_ROUNDS.1 - COMPUTE_ROUNDS.0 + 1;
                    let rounds = (COMPUTE_ROUNDS.0 + rng.below(span)) as u32;
                    (sender, Action::Compute { rounds })
                }
                WorkloadKind::Hybrid => {
                    let sender = senders.pick(&mut rng);
                    let is_hot = rng.chance(cfg.hot_share);
                    // Cold picks avoid the hot account and pair, so `hot_share` is exactly the
                    // share of transactions that touch them.
                    let to = if is_hot {
                        hot
                    } else {
                        recipient(&mut rng, n, &[sender, hot])
                    };
                    let action = match rng.below(3) {
                        0 => Action::Eth {
                            to,
                            value: rng.between(ETH_VALUE.0, ETH_VALUE.1),
                        },
                        1 => Action::Erc20 {
                            to,
                            amount: rng.between(TOKEN_AMOUNT.0, TOKEN_AMOUNT.1),
                        },
                        _ => {
                            let pair = match (is_hot, pairs) {
                                (true, _) | (false, 1) => 0,
                                (false, _) => 1 + rng.below(pairs - 1) as u32,
                            };
                            swap(&mut rng, pair)
                        }
                    };
                    (sender, action)
                }
            };
            let nonce = nonces[sender as usize];
            nonces[sender as usize] += 1;
            txs.push(PlannedTx {
                sender,
                nonce,
                action,
            });
        }
        blocks.push(txs);
    }
    blocks
}

/// Allowance: the next transaction. Half approve, half spend an open approval (`open`: not
/// spent yet, as (owner, spender, amount)) picked at random, so some spends follow their
/// approval inside a block and others blocks later.
fn allowance(
    rng: &mut Rng,
    senders: &mut Senders,
    accounts: usize,
    open: &mut Vec<(u32, u32, U256)>,
) -> (u32, Action) {
    let spend = |rng: &mut Rng, open: &mut Vec<(u32, u32, U256)>, i: usize| {
        let (from, spender, amount) = open.swap_remove(i);
        let to = recipient(rng, accounts, &[from]);
        (spender, Action::TransferFrom { from, to, amount })
    };
    if !open.is_empty() && rng.below(2) == 0 {
        let i = rng.below(open.len() as u64) as usize;
        return spend(rng, open, i);
    }
    let owner = senders.pick(rng);
    let spender = recipient(rng, accounts, &[owner]);
    match open
        .iter()
        .position(|&(o, s, _)| (o, s) == (owner, spender))
    {
        // A second approval of the pair would overwrite the open one (approve sets the
        // allowance, it does not add to it): spend that one instead.
        Some(i) => spend(rng, open, i),
        None => {
            let amount = rng.between(TOKEN_AMOUNT.0, TOKEN_AMOUNT.1);
            open.push((owner, spender, amount));
            (owner, Action::Approve { spender, amount })
        }
    }
}

fn swap(rng: &mut Rng, pair: u32) -> Action {
    let token0_in = rng.below(2) == 0;
    Action::Swap {
        pair,
        token0_in,
        amount_in: rng.between(SWAP_AMOUNT.0, SWAP_AMOUNT.1),
    }
}
