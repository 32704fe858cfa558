//! Calldata and storage-slot helpers for the contracts the workloads call.

/// ERC20 calls and the OpenZeppelin v5 `ERC20` storage layout.
///
/// The slot functions are exact for OpenZeppelin v5's (non-upgradeable) `ERC20` and any
/// contract that declares the same three variables first; the generator checks the layout in
/// the compiled artifact before it relies on it. The parallel executor uses them as
/// dependency hints: a `transfer(to, v)` from `s` writes `balance_slot(s)` and
/// `balance_slot(to)`.
pub mod erc20 {
    use alloy_primitives::{Address, B256, Bytes, U256, keccak256};
    use alloy_sol_types::{SolCall, sol};

    sol! {
        function transfer(address to, uint256 value) external returns (bool);
        function transferFrom(address from, address to, uint256 value) external returns (bool);
        function approve(address spender, uint256 value) external returns (bool);
        function balanceOf(address account) external view returns (uint256);
        function allowance(address owner, address spender) external view returns (uint256);
        function totalSupply() external view returns (uint256);
    }

    /// `transfer(address,uint256)`.
    pub const TRANSFER_SELECTOR: [u8; 4] = transferCall::SELECTOR;
    /// `transferFrom(address,address,uint256)`.
    pub const TRANSFER_FROM_SELECTOR: [u8; 4] = transferFromCall::SELECTOR;
    /// `approve(address,uint256)`.
    pub const APPROVE_SELECTOR: [u8; 4] = approveCall::SELECTOR;
    /// `balanceOf(address)`.
    pub const BALANCE_OF_SELECTOR: [u8; 4] = balanceOfCall::SELECTOR;
    /// `allowance(address,address)`.
    pub const ALLOWANCE_SELECTOR: [u8; 4] = allowanceCall::SELECTOR;
    /// `totalSupply()`.
    pub const TOTAL_SUPPLY_SELECTOR: [u8; 4] = totalSupplyCall::SELECTOR;

    /// Slot of `mapping(address => uint256) _balances`.
    pub const BALANCES_SLOT: U256 = U256::ZERO;
    /// Slot of `mapping(address => mapping(address => uint256)) _allowances`.
    pub const ALLOWANCES_SLOT: U256 = U256::from_limbs([1, 0, 0, 0]);
    /// Slot of `uint256 _totalSupply`.
    pub const TOTAL_SUPPLY_SLOT: U256 = U256::from_limbs([2, 0, 0, 0]);

    /// Storage slot of `mapping[key]` for a mapping declared at `slot` (Solidity's layout:
    /// keccak of the left-padded key followed by the slot).
    pub fn mapping_slot(key: B256, slot: U256) -> U256 {
        let mut preimage = [0u8; 64];
        preimage[..32].copy_from_slice(key.as_slice());
        preimage[32..].copy_from_slice(&slot.to_be_bytes::<32>());
        keccak256(preimage).into()
    }

    /// Storage slot of `_balances[owner]`.
    pub fn balance_slot(owner: Address) -> U256 {
        mapping_slot(owner.into_word(), BALANCES_SLOT)
    }

    /// Storage slot of `_allowances[owner][spender]`.
    pub fn allowance_slot(owner: Address, spender: Address) -> U256 {
        let inner = mapping_slot(owner.into_word(), ALLOWANCES_SLOT);
        mapping_slot(spender.into_word(), inner)
    }

    /// Calldata of `transfer(to, value)`.
    pub fn encode_transfer(to: Address, value: U256) -> Bytes {
        transferCall { to, value }.abi_encode().into()
    }

    /// Calldata of `transferFrom(from, to, value)`.
    pub fn encode_transfer_from(from: Address, to: Address, value: U256) -> Bytes {
        transferFromCall { from, to, value }.abi_encode().into()
    }

    /// Calldata of `approve(spender, value)`.
    pub fn encode_approve(spender: Address, value: U256) -> Bytes {
        approveCall { spender, value }.abi_encode().into()
    }

    /// Calldata of `balanceOf(account)`.
    pub fn encode_balance_of(account: Address) -> Bytes {
        balanceOfCall { account }.abi_encode().into()
    }

    /// Calldata of `allowance(owner, spender)`.
    pub fn encode_allowance(owner: Address, spender: Address) -> Bytes {
        allowanceCall { owner, spender }.abi_encode().into()
    }

    /// `(to, value)` of `transfer` calldata, `None` for any other input.
    pub fn decode_transfer(input: &[u8]) -> Option<(Address, U256)> {
        let call = transferCall::abi_decode(input).ok()?;
        Some((call.to, call.value))
    }

    /// `(from, to, value)` of `transferFrom` calldata, `None` for any other input.
    pub fn decode_transfer_from(input: &[u8]) -> Option<(Address, Address, U256)> {
        let call = transferFromCall::abi_decode(input).ok()?;
        Some((call.from, call.to, call.value))
    }

    /// `(spender, value)` of `approve` calldata, `None` for any other input.
    pub fn decode_approve(input: &[u8]) -> Option<(Address, U256)> {
        let call = approveCall::abi_decode(input).ok()?;
        Some((call.spender, call.value))
    }
}

/// Uniswap V2: pair addresses, the pair's reserve slot and the router's swap call.
pub mod uniswap {
    use alloy_primitives::{Address, B256, Bytes, U256, b256, keccak256};
    use alloy_sol_types::{SolCall, sol};

    sol! {
        function createPair(address tokenA, address tokenB) external returns (address pair);
        function mint(address to) external returns (uint256 liquidity);
        function getReserves() external view returns (uint112 reserve0, uint112 reserve1, uint32 blockTimestampLast);
        function swapExactTokensForTokens(
            uint256 amountIn,
            uint256 amountOutMin,
            address[] path,
            address to,
            uint256 deadline
        ) external returns (uint256[] amounts);
        function swapExactTokensForTokensSupportingFeeOnTransferTokens(
            uint256 amountIn,
            uint256 amountOutMin,
            address[] path,
            address to,
            uint256 deadline
        ) external;
    }

    /// keccak of `UniswapV2Pair`'s creation code, hard-coded in the router's
    /// `UniswapV2Library.pairFor`. The published @uniswap/v2-core 1.0.1 artifact hashes to it,
    /// which the generator verifies before routing swaps through the router.
    pub const INIT_CODE_HASH: B256 =
        b256!("96e8ac4277198ff8b6f785478aa9a39f403cb768dd02cbee326c3e7da348845f");

    /// Slot of the pair's packed `reserve0 (uint112) | reserve1 (uint112) |
    /// blockTimestampLast (uint32)`, after `UniswapV2ERC20`'s five variables and the pair's
    /// `factory`, `token0`, `token1`.
    pub const RESERVES_SLOT: U256 = U256::from_limbs([8, 0, 0, 0]);

    /// `swapExactTokensForTokens(uint256,uint256,address[],address,uint256)`.
    pub const SWAP_EXACT_TOKENS_FOR_TOKENS_SELECTOR: [u8; 4] =
        swapExactTokensForTokensCall::SELECTOR;
    /// `swapExactTokensForTokensSupportingFeeOnTransferTokens(uint256,uint256,address[],address,uint256)`.
    pub const SWAP_FEE_ON_TRANSFER_SELECTOR: [u8; 4] =
        swapExactTokensForTokensSupportingFeeOnTransferTokensCall::SELECTOR;

    /// The two tokens in the pair's order (`token0 < token1`).
    pub fn sort_tokens(a: Address, b: Address) -> (Address, Address) {
        if a < b { (a, b) } else { (b, a) }
    }

    /// The CREATE2 address of the pair of `a` and `b`, as the router computes it.
    pub fn pair_address(factory: Address, a: Address, b: Address) -> Address {
        let (token0, token1) = sort_tokens(a, b);
        let mut salt_preimage = [0u8; 40];
        salt_preimage[..20].copy_from_slice(token0.as_slice());
        salt_preimage[20..].copy_from_slice(token1.as_slice());
        factory.create2(keccak256(salt_preimage), INIT_CODE_HASH)
    }

    /// `(reserve0, reserve1, blockTimestampLast)` from the word at [`RESERVES_SLOT`].
    pub fn decode_reserves(word: U256) -> (U256, U256, u32) {
        let mask = (U256::from(1u8) << 112) - U256::from(1u8);
        let reserve0 = word & mask;
        let reserve1 = (word >> 112) & mask;
        let timestamp: u32 = (word >> 224usize).to();
        (reserve0, reserve1, timestamp)
    }

    /// `UniswapV2Library.getAmountOut`: the output of a swap with the 0.3% fee.
    pub fn amount_out(amount_in: U256, reserve_in: U256, reserve_out: U256) -> U256 {
        let with_fee = amount_in * U256::from(997u16);
        let denominator = reserve_in * U256::from(1000u16) + with_fee;
        if denominator.is_zero() {
            U256::ZERO
        } else {
            with_fee * reserve_out / denominator
        }
    }

    /// A decoded `swapExactTokensForTokens` (or fee-on-transfer variant) call with a two-token
    /// path.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Swap {
        /// Exact input amount of `token_in`.
        pub amount_in: U256,
        /// Minimum accepted output.
        pub amount_out_min: U256,
        /// Token paid in.
        pub token_in: Address,
        /// Token paid out.
        pub token_out: Address,
        /// Receiver of `token_out`.
        pub to: Address,
        /// Latest accepted block timestamp.
        pub deadline: U256,
    }

    /// Router calldata for `swap`.
    pub fn encode_swap(swap: &Swap) -> Bytes {
        swapExactTokensForTokensCall {
            amountIn: swap.amount_in,
            amountOutMin: swap.amount_out_min,
            path: vec![swap.token_in, swap.token_out],
            to: swap.to,
            deadline: swap.deadline,
        }
        .abi_encode()
        .into()
    }

    /// Router calldata for `swap` through
    /// `swapExactTokensForTokensSupportingFeeOnTransferTokens`: for tokens without a transfer
    /// fee it swaps exactly as `swapExactTokensForTokens` does (it reads the pair's balance
    /// instead of computing the input), under another selector.
    pub fn encode_swap_fee_on_transfer(swap: &Swap) -> Bytes {
        // Same arguments, same encoding: only the selector differs.
        let mut input = encode_swap(swap).to_vec();
        input[..4].copy_from_slice(&SWAP_FEE_ON_TRANSFER_SELECTOR);
        input.into()
    }

    /// The swap in router calldata of either swap function; `None` for other input or a path
    /// that is not two tokens.
    pub fn decode_swap(input: &[u8]) -> Option<Swap> {
        // The fee-on-transfer variant takes the same arguments under its own selector.
        let call = match input.split_first_chunk::<4>() {
            Some((&SWAP_FEE_ON_TRANSFER_SELECTOR, args)) => {
                swapExactTokensForTokensCall::abi_decode_raw(args).ok()?
            }
            _ => swapExactTokensForTokensCall::abi_decode(input).ok()?,
        };
        let [token_in, token_out] = call.path.as_slice() else {
            return None;
        };
        Some(Swap {
            amount_in: call.amountIn,
            amount_out_min: call.amountOutMin,
            token_in: *token_in,
            token_out: *token_out,
            to: call.to,
            deadline: call.deadline,
        })
    }

    pub(crate) fn encode_create_pair(token_a: Address, token_b: Address) -> Bytes {
        createPairCall {
            tokenA: token_a,
            tokenB: token_b,
        }
        .abi_encode()
        .into()
    }

    pub(crate) fn encode_mint(to: Address) -> Bytes {
        mintCall { to }.abi_encode().into()
    }

    pub(crate) fn encode_get_reserves() -> Bytes {
        getReservesCall {}.abi_encode().into()
    }
}

/// The compute workload's contract: hand-assembled EVM code that hashes a word `rounds` times
/// and stores the result under the caller. Each call is CPU-heavy (about 90 gas and one Keccak
/// per round) and touches one storage slot of its own, so calls from different senders are
/// independent: the shape of blocks of few, heavy transactions.
pub mod compute {
    use alloy_primitives::{Address, Bytes, U256, address, hex};

    /// Where the generator places the contract (in the genesis, no constructor).
    pub const ADDRESS: Address = address!("0x00000000000000000000000000000000c0ffee00");

    /// The runtime code. Calldata is one word, `rounds`.
    ///
    /// ```text
    /// 00 PUSH1 0  CALLDATALOAD          ; rounds
    /// 03 CALLER SLOAD CALLER XOR        ; storage[caller] ^ caller
    /// 07 PUSH1 0  MSTORE                ; mem[0] = that
    /// 0a JUMPDEST                       ; loop:
    /// 0b DUP1 ISZERO PUSH1 0x1f JUMPI   ;   rounds == 0 → done
    /// 10 PUSH1 32 PUSH1 0 KECCAK256     ;   mem[0] = keccak(mem[0])
    /// 15 PUSH1 0  MSTORE
    /// 18 PUSH1 1 SWAP1 SUB              ;   rounds -= 1
    /// 1c PUSH1 0x0a JUMP
    /// 1f JUMPDEST POP                   ; done:
    /// 21 PUSH1 0 MLOAD CALLER SSTORE    ; storage[caller] = mem[0]
    /// 26 STOP
    /// ```
    pub const RUNTIME: [u8; 39] = hex!(
        "60003533543318600052" "5b8015601f57602060002060005260019003600a56" "5b506000513355" "00"
    );

    /// Gas of one round of the loop.
    pub const GAS_PER_ROUND: u64 = 88;

    /// A gas limit that covers a call of `rounds` rounds: the intrinsic 21,000 and calldata,
    /// a cold `SLOAD`, a fresh `SSTORE`, and the rounds, with room to spare.
    pub fn gas_limit(rounds: u32) -> u64 {
        60_000 + GAS_PER_ROUND * u64::from(rounds)
    }

    /// The calldata of a call of `rounds` rounds.
    pub fn encode(rounds: u32) -> Bytes {
        Bytes::from(U256::from(rounds).to_be_bytes::<32>().to_vec())
    }

    /// The slot a call from `caller` stores its result in.
    pub fn result_slot(caller: Address) -> U256 {
        U256::from_be_slice(caller.as_slice())
    }
}
