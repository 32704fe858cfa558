use crate::WorkloadError;
use std::{fmt, str::FromStr};

/// Which transactions fill the generated blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    /// Plain ETH transfers between funded accounts.
    Transfer,
    /// `transfer` calls on one OpenZeppelin v5 ERC20.
    Erc20,
    /// `swapExactTokensForTokens` through the Uniswap V2 router over `pairs` independent pairs.
    Uniswap,
    /// A third each of ETH transfers, ERC20 transfers and swaps, with `hot_share` of them
    /// aimed at one hot account or one hot pair.
    Hybrid,
    /// ERC20 transfers where each transaction's sender is the previous one's recipient, so
    /// the block is one dependency chain.
    Chained,
    /// The uniswap workload's swaps through the router's
    /// `swapExactTokensForTokensSupportingFeeOnTransferTokens`, whose calldata the executor's
    /// hints do not decode: speculation alone keeps the swaps apart, and the DAG learns only
    /// from the conflicts it finds.
    Router,
    /// ERC20 allowances on the main token: holders `approve` a spender, and each spender later
    /// (in the same block or a later one) moves exactly that amount with `transferFrom`, so a
    /// spend depends on its approval through the allowance slot alone.
    Allowance,
    /// Calls of a CPU-heavy contract ([`compute`](crate::compute)): each hashes a word
    /// 2,000 to 10,000 times (about 0.2 to 0.9 Mgas) and stores the result in a slot of its
    /// sender's own, so the calls are independent. Blocks of a few heavy transactions.
    Compute,
    /// ETH transfers among accounts around an exchange's hot wallet (the hot account): one
    /// transaction in ten a deposit into it, one in a hundred a withdrawal from it to a random
    /// account, the rest between random accounts. The wallet is credited lazily between its
    /// own sends, each of which must see every deposit before it.
    Exchange,
}

impl WorkloadKind {
    /// Every kind, in a fixed order.
    pub const ALL: [Self; 9] = [
        Self::Transfer,
        Self::Erc20,
        Self::Uniswap,
        Self::Hybrid,
        Self::Chained,
        Self::Allowance,
        Self::Router,
        Self::Compute,
        Self::Exchange,
    ];

    /// The name `FromStr` accepts and `Display` prints.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Transfer => "transfer",
            Self::Erc20 => "erc20",
            Self::Uniswap => "uniswap",
            Self::Hybrid => "hybrid",
            Self::Chained => "chained",
            Self::Allowance => "allowance",
            Self::Router => "router",
            Self::Compute => "compute",
            Self::Exchange => "exchange",
        }
    }

    pub(crate) const fn needs_token(self) -> bool {
        matches!(
            self,
            Self::Erc20 | Self::Hybrid | Self::Chained | Self::Allowance
        )
    }

    pub(crate) const fn needs_uniswap(self) -> bool {
        matches!(self, Self::Uniswap | Self::Hybrid | Self::Router)
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| WorkloadError::UnknownKind(s.to_string()))
    }
}

/// What to generate. Same config (seed included), same bytes out.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadConfig {
    /// The transaction mix.
    pub kind: WorkloadKind,
    /// Funded accounts in the genesis; senders and recipients are drawn from them.
    pub accounts: usize,
    /// Transactions in each generated block.
    pub txs_per_block: usize,
    /// Number of generated blocks (numbers 1..=blocks).
    pub blocks: usize,
    /// Seed of the keys and of every random choice.
    pub seed: u64,
    /// Hybrid only: share of transactions that touch the hot account (ETH and ERC20
    /// transfers to it) or the hot pair (swaps on pair 0). Other kinds ignore it.
    pub hot_share: f64,
    /// Share of transactions sent by [`HOT_SENDERS`](crate::HOT_SENDERS) hot senders (each
    /// with consecutive nonces). Chained ignores it: its senders are fixed by the chain.
    pub sender_skew: f64,
    /// Uniswap, router and hybrid: number of pairs, each with its own two tokens.
    pub pairs: usize,
}

/// Fewest accounts a workload accepts: the hot senders, the hot account and enough others
/// that a sender never has to pay itself.
pub const MIN_ACCOUNTS: usize = 16;

/// Most transactions (`txs_per_block * blocks`) a workload accepts. The fixed genesis
/// balances are sized so that even one account sending all of them cannot run dry.
pub const MAX_TOTAL_TXS: usize = 10_000_000;

impl WorkloadConfig {
    /// A config of `kind` with the defaults: 10,000 accounts, 1,000 transactions × 1 block,
    /// seed 1, `hot_share` 0.3, no sender skew, 300 pairs.
    pub fn new(kind: WorkloadKind) -> Self {
        Self {
            kind,
            accounts: 10_000,
            txs_per_block: 1_000,
            blocks: 1,
            seed: 1,
            hot_share: 0.3,
            sender_skew: 0.0,
            pairs: 300,
        }
    }

    /// Checks the ranges the generator relies on.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |msg: String| Err(WorkloadError::InvalidConfig(msg));
        if self.accounts < MIN_ACCOUNTS {
            return bad(format!(
                "accounts = {}, need at least {MIN_ACCOUNTS}",
                self.accounts
            ));
        }
        if self.accounts > u32::MAX as usize {
            return bad(format!("accounts = {} exceeds {}", self.accounts, u32::MAX));
        }
        match self.txs_per_block.checked_mul(self.blocks) {
            Some(total) if total <= MAX_TOTAL_TXS => {}
            _ => {
                return bad(format!(
                    "txs_per_block × blocks = {} × {} exceeds {MAX_TOTAL_TXS}",
                    self.txs_per_block, self.blocks
                ));
            }
        }
        for (name, value) in [
            ("hot_share", self.hot_share),
            ("sender_skew", self.sender_skew),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return bad(format!("{name} = {value}, must be within 0..=1"));
            }
        }
        if self.kind.needs_uniswap() && !(1..=100_000).contains(&self.pairs) {
            return bad(format!("pairs = {}, must be within 1..=100000", self.pairs));
        }
        Ok(())
    }
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self::new(WorkloadKind::Erc20)
    }
}
