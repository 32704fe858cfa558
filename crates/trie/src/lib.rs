//! overdrive-trie
