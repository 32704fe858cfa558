// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// The ERC20 of the overdrive workloads: OpenZeppelin v5's ERC20, unmodified, so the generated
/// transfers execute the same code (and storage layout) as most tokens on mainnet.
contract Token is ERC20 {
    constructor(string memory name_, string memory symbol_, uint256 initialSupply) ERC20(name_, symbol_) {
        _mint(msg.sender, initialSupply);
    }
}
