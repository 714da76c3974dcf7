#pragma once
// Private: a walk over a pickle's opcodes before libtorch's unpickler reads it.
//
// libtorch's unpickler trusted what a pickle states (the fuzzer's finds, under libtorch 1.13,
// before 0.2.0 dropped it; the walk stays, since torch 2.x's has not been shown to check all
// of it). It reserved a string of a stated length and a memo table up to a stated index
// before reading on (a damaged BINUNICODE or LONG_BINPUT allocated gigabytes: the
// tensor_file fuzzer's third and fourth finds), and it popped its stack without looking (a
// NEWOBJ first thing read below an empty stack: a segfault, the fifth find). Every pickle
// mixtrain hands it (data files, checkpoints, TorchScript models) is walked here first:
// each length must fit what is left, each memo index must be one a pickle of this size can
// have, and no opcode may take more from the stack, or from above its last MARK, than is there.
// Opcodes the walk does not know end it: the unpickler's own error names them.

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace mixtrain::detail {

inline void check_pickle(const char* data, size_t size) {
  size_t at = 0;
  const auto need = [&](uint64_t n) {
    TORCH_CHECK(n <= size - at, "damaged: its pickle states a length of ", n, " bytes with ", size - at, " left");
    at += static_cast<size_t>(n);
  };
  const auto le = [&](int bytes) {
    need(static_cast<uint64_t>(bytes));
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(data[at - bytes + i]);
    return v;
  };
  const auto line = [&] {
    const void* nl = std::memchr(data + at, '\n', size - at);
    TORCH_CHECK(nl, "damaged: its pickle ends inside a text argument");
    at = static_cast<size_t>(static_cast<const char*>(nl) - data) + 1;
  };
  const auto memo_index = [&] {  // a 4-byte memo index: at most one entry per byte of pickle
    const uint64_t index = le(4);
    TORCH_CHECK(index < size, "damaged: its pickle names memo entry ", index, " in ", size, " bytes");
  };
  // The unpickler's stack, by depth, and its marks.
  size_t depth = 0;
  std::vector<size_t> marks;
  const auto take = [&](size_t n, size_t pushed) {  // pops n, pushes `pushed`
    TORCH_CHECK(depth >= n && (marks.empty() || depth - n >= marks.back()),
                "damaged: its pickle takes ", n, " value(s) from a stack holding ", depth, " above its last mark");
    depth = depth - n + pushed;
  };
  const auto to_mark = [&](size_t pushed, bool needs_target) {  // pops back to the last MARK
    TORCH_CHECK(!marks.empty() && marks.back() <= depth, "damaged: its pickle closes a MARK it never opened");
    depth = marks.back();
    marks.pop_back();
    if (needs_target) take(1, 1);  // the list, dict or set the items go into
    depth += pushed;
  };
  while (at < size) {
    const auto op = static_cast<uint8_t>(data[at++]);
    switch (op) {
      case '.': take(1, 1); return;  // STOP: the result
      case 0x80: need(1); break;      // PROTO
      case 0x95: need(8); break;      // FRAME
      case '(': marks.push_back(depth); break;
      // Push one value, with no argument.
      case ')': case '}': case ']': case 'N': case 0x88: case 0x89: case 0x8f: take(0, 1); break;
      // Push one value read from a fixed-size argument.
      case 'K': take(0, 1); need(1); break;
      case 'M': take(0, 1); need(2); break;
      case 'J': take(0, 1); need(4); break;
      case 'G': take(0, 1); need(8); break;
      // Push one value read from a length-prefixed argument: the length must fit what is left.
      case 'C': case 'U': case 0x8c: case 0x8a: take(0, 1); need(le(1)); break;
      case 'X': case 'B': case 'T': case 0x8b: take(0, 1); need(le(4)); break;
      case 0x8d: case 0x8e: case 0x96: take(0, 1); need(le(8)); break;
      // Push one value read from text (GLOBAL takes two lines).
      case 'c': take(0, 1); line(); line(); break;
      case 'I': case 'L': case 'S': case 'V': case 'F': case 'P': take(0, 1); line(); break;
      // Memo: a get pushes, a put reads the top. An index sizes the unpickler's memo
      // table (a 4-byte one could ask for 4G entries): a pickle puts at most one per opcode.
      case 'h': take(0, 1); need(1); break;
      case 'g': take(0, 1); line(); break;
      case 'j': take(0, 1); memo_index(); break;
      case 'q': take(1, 1); need(1); break;
      case 'p': take(1, 1); line(); break;
      case 'r': take(1, 1); memo_index(); break;
      case 0x94: take(1, 1); break;  // MEMOIZE
      // Take values, push one.
      case 'Q': take(1, 1); break;                        // BINPERSID
      case 0x85: take(1, 1); break;                       // TUPLE1
      case 0x86: case 'R': case 0x81: case 0x93: case 'b': case 'a': take(2, 1); break;
      case 0x87: case 's': case 0x92: take(3, 1); break;  // TUPLE3, SETITEM, NEWOBJ_EX
      case '0': take(1, 0); break;                        // POP
      case '2': take(1, 2); break;                        // DUP
      // Back to the last MARK.
      case 't': case 'l': case 'd': case 0x91: case 'o': to_mark(1, false); break;
      case 'i': to_mark(1, false); line(); line(); break;  // INST
      case 'e': case 'u': case 0x90: to_mark(0, true); break;
      case '1': to_mark(0, false); break;  // POP_MARK
      default: return;  // not a pickle opcode the walk knows: the unpickler's error names it
    }
  }
}

} // namespace mixtrain::detail
