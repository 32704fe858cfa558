"""The same signed transactions on the node and on anvil (Foundry's node, a second
implementation) give the same receipts and final balances.

Usage: anvil_diff.py NODE_URL ANVIL_URL TOKEN_ARTIFACT. Both chains must be fresh dev chains of
chain id 1337 funding the "test test ... junk" accounts.
"""

import json
import sys

from eth_account import Account
from web3 import Web3

KEYS = [
    "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",
    "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d",
]
GWEI = 10**9


def signed_sequence(chain_id, token_json):
    """Deploy, transfers of ether and tokens, an approval spent by another account, a
    transfer that reverts, and a self-destructing contract creation: raw transactions."""
    a, b = (Account.from_key(k) for k in KEYS)
    token = Web3().eth.contract(abi=token_json["abi"], bytecode=token_json["bytecode"])
    address = Web3.to_checksum_address(Web3.keccak(bytes.fromhex("d694") + bytes.fromhex(a.address[2:]) + b"\x80")[12:])
    recipients = [Account.from_key(Web3.keccak(text=f"recipient {i}")).address for i in range(3)]
    nonces = {a.address: 0, b.address: 0}

    def tx(sender, **fields):
        fields = {"chainId": chain_id, "nonce": nonces[sender.address], "maxFeePerGas": 50 * GWEI,
                  "maxPriorityFeePerGas": GWEI, "gas": 200_000, "value": 0, **fields}
        nonces[sender.address] += 1
        return sender.sign_transaction(fields).raw_transaction

    contract = Web3().eth.contract(address=address, abi=token_json["abi"])
    data = lambda call: call._encode_transaction_data()  # noqa: E731
    txs = [tx(a, data=token.constructor("Diff", "DIF", 10**24).data_in_transaction, gas=3_000_000)]
    txs += [tx(a, to=r, value=10**18 + i) for i, r in enumerate(recipients)]
    txs += [tx(a, to=address, data=data(contract.functions.transfer(r, 1000 * (i + 1)))) for i, r in enumerate(recipients)]
    txs.append(tx(a, to=address, data=data(contract.functions.approve(b.address, 5000))))
    txs.append(tx(b, to=address, data=data(contract.functions.transferFrom(a.address, recipients[0], 4000))))
    # Exceeds the allowance left: reverts, and the block still holds it.
    txs.append(tx(b, to=address, data=data(contract.functions.transferFrom(a.address, recipients[1], 4000))))
    # A constructor that self-destructs to recipient 2 (PUSH20 addr SELFDESTRUCT), with value.
    txs.append(tx(a, data="0x73" + recipients[2][2:] + "ff", value=777))
    return txs, address, recipients


def run(url, txs):
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
    hashes = [w3.eth.send_raw_transaction(raw) for raw in txs]
    receipts = [w3.eth.wait_for_transaction_receipt(h, timeout=60) for h in hashes]
    return w3, [
        (r.status, r.gasUsed, r.contractAddress,
         [(log.address, [t.hex() for t in log.topics], log.data.hex()) for log in r.logs])
        for r in receipts
    ]


def main():
    node, anvil, artifact = sys.argv[1:4]
    token_json = json.load(open(artifact))
    chain_ids = {Web3(Web3.HTTPProvider(u)).eth.chain_id for u in (node, anvil)}
    if len(chain_ids) != 1:
        sys.exit(f"anvil diff: the chains differ in id: {chain_ids}")
    txs, token, recipients = signed_sequence(chain_ids.pop(), token_json)
    results = {}
    for name, url in (("node", node), ("anvil", anvil)):
        w3, receipts = run(url, txs)
        balances = [w3.eth.get_balance(r) for r in recipients]
        on_node = w3.eth.contract(address=token, abi=token_json["abi"])
        tokens = [on_node.functions.balanceOf(r).call() for r in recipients]
        results[name] = (receipts, balances, tokens)
        print(f"anvil diff: {name}: {len(receipts)} receipts, statuses {[r[0] for r in receipts]}, "
              f"gas {[r[1] for r in receipts]}, token balances {tokens}")
    if results["node"] != results["anvil"]:
        for i, (x, y) in enumerate(zip(results["node"][0], results["anvil"][0])):
            if x != y:
                print(f"anvil diff: transaction {i}: node {x} anvil {y}")
        sys.exit(f"anvil diff: the node and anvil disagree: {results['node'][1:]} vs {results['anvil'][1:]}")
    if [r[0] for r in results["node"][0]].count(0) != 1:
        sys.exit("anvil diff: exactly one transaction should have reverted")
    print("anvil diff: the node and anvil agree on every receipt and balance")


if __name__ == "__main__":
    main()
