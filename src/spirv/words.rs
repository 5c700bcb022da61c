//! The SPIR-V word stream as the passes read and write it: instruction headers, literal strings,
//! and the opcodes more than one pass needs.

pub(crate) const OP_CONSTANT: u32 = 43;
pub(crate) const OP_TYPE_COOP_MATRIX: u32 = 4456;

/// Iterates over the instructions of a module: `(offset of the first word, opcode, word count)`.
pub(crate) fn instructions(words: &[u32]) -> Vec<(usize, u32, usize)> {
    let mut out = Vec::new();
    let mut at = 5; // after the header
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 {
            break;
        }
        out.push((at, words[at] & 0xffff, count));
        at += count;
    }
    out
}

/// The string of an `OpName` (or any literal string starting at `words[0]`).
pub(crate) fn literal_string(words: &[u32]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One instruction: its header word (word count, opcode) and operands.
pub(crate) fn instruction(op: u32, operands: &[u32]) -> Vec<u32> {
    let mut w = Vec::with_capacity(operands.len() + 1);
    w.push(((operands.len() as u32 + 1) << 16) | op);
    w.extend_from_slice(operands);
    w
}
