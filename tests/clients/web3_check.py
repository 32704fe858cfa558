"""A node checked by web3.py, a client nobody here wrote.

Deploys the project's OpenZeppelin ERC20, sends ether and tokens, and reads back receipts, logs,
balances, storage, calls and gas estimates. Usage: web3_check.py RPC_URL TOKEN_ARTIFACT
"""

import json
import sys

from eth_account import Account
from web3 import Web3

# The first account of reth's --dev chain (the "test test ... junk" mnemonic).
DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"


def check(what, got, expected):
    if got != expected:
        sys.exit(f"web3.py: {what}: got {got!r}, expected {expected!r}")
    print(f"web3.py: {what}: {got!r}")


def main():
    rpc, artifact = sys.argv[1], sys.argv[2]
    w3 = Web3(Web3.HTTPProvider(rpc, request_kwargs={"timeout": 60}))
    me = Account.from_key(DEV_KEY)
    token_json = json.load(open(artifact))
    chain_id = w3.eth.chain_id
    print(f"web3.py {w3.api}: chain {chain_id}, head {w3.eth.block_number}")

    def send(tx):
        tx = {"chainId": chain_id, "nonce": w3.eth.get_transaction_count(me.address), **tx}
        tx.setdefault("maxFeePerGas", w3.eth.gas_price * 2 + 10**9)
        tx.setdefault("maxPriorityFeePerGas", 10**9)
        if "gas" not in tx:
            tx["gas"] = w3.eth.estimate_gas({k: v for k, v in tx.items() if k != "nonce"} | {"from": me.address})
        signed = me.sign_transaction(tx)
        receipt = w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(signed.raw_transaction), timeout=60)
        check(f"receipt status of tx {receipt.transactionHash.hex()[:10]}", receipt.status, 1)
        return receipt

    # Deploy: 1,000,000 tokens to the deployer.
    supply = 10**24
    token = w3.eth.contract(abi=token_json["abi"], bytecode=token_json["bytecode"])
    deploy = token.constructor("Overdrive Check", "ODC", supply).build_transaction({"from": me.address, "chainId": chain_id})
    receipt = send({"data": deploy["data"], "gas": deploy["gas"]})
    address = receipt.contractAddress
    check("deployed code present", len(w3.eth.get_code(address)) > 0, True)
    token = w3.eth.contract(address=address, abi=token_json["abi"])
    check("name()", token.functions.name().call(), "Overdrive Check")
    check("totalSupply()", token.functions.totalSupply().call(), supply)

    # Ether to a fresh account.
    to = Account.create().address
    receipt = send({"to": to, "value": 12345})
    check("ether transfer gas used", receipt.gasUsed, 21000)
    check("recipient balance", w3.eth.get_balance(to), 12345)

    # Tokens: the Transfer log, balances by call and by storage (OpenZeppelin v5 keeps
    # _balances at slot 0: keccak(pad(address) . pad(0))).
    amount = 777
    call = token.functions.transfer(to, amount)
    estimate = call.estimate_gas({"from": me.address})
    check("transfer estimate in range", 30_000 < estimate < 80_000, True)
    receipt = send({"to": address, "data": call._encode_transaction_data()})
    check("gas used within the estimate", receipt.gasUsed <= estimate, True)
    events = token.events.Transfer().process_receipt(receipt)
    check("Transfer logs", len(events), 1)
    check("Transfer args", (events[0].args["from"], events[0].args["to"], events[0].args["value"]), (me.address, to, amount))
    check("balanceOf(recipient)", token.functions.balanceOf(to).call(), amount)
    check("balanceOf(deployer)", token.functions.balanceOf(me.address).call(), supply - amount)
    slot = Web3.keccak(bytes(12) + bytes.fromhex(to[2:]) + bytes(32))
    check("storage of the recipient's balance", int.from_bytes(w3.eth.get_storage_at(address, slot), "big"), amount)
    logs = w3.eth.get_logs({"fromBlock": receipt.blockNumber, "toBlock": receipt.blockNumber, "address": address})
    check("eth_getLogs", len(logs), 1)
    block = w3.eth.get_block(receipt.blockNumber)
    check("the block lists the transaction", receipt.transactionHash in block.transactions, True)
    print("web3.py: all checks passed")


if __name__ == "__main__":
    main()
