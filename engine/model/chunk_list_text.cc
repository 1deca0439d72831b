#include "shardckpt/engine/model/chunk_list_text.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

namespace shardckpt {
namespace {

// 18 digits always fit in int64 and uint64, so no overflow test is needed per digit; longer
// numbers (rare: offsets past 10^18 bytes) are left to the general reader.
constexpr size_t kMaxDigits = 18;

// Each reader takes the position of its first character and returns the position after its text,
// or nullptr when the text there is not in the compact form. Plain pointers rather than an object
// holding one, so the position stays in a register through the digit loops.

// JSON's spelling of a non-negative integer: no sign, no leading zero, no fraction or exponent
// (the character after it must be ',' or ']', which the caller checks).
inline const char* Unsigned(const char* p, const char* end, uint64_t* value) {
  const char* start = p;
  uint64_t v = 0;
  while (p != end && static_cast<unsigned char>(*p - '0') < 10) v = v * 10 + static_cast<uint64_t>(*p++ - '0');
  const size_t digits = static_cast<size_t>(p - start);
  if (digits == 0 || digits > kMaxDigits || (digits > 1 && *start == '0')) return nullptr;
  *value = v;
  return p;
}

inline const char* Signed(const char* p, const char* end, int64_t* value) {
  const bool negative = p != end && *p == '-';
  uint64_t magnitude = 0;
  p = Unsigned(p + negative, end, &magnitude);
  *value = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  return p;
}

inline const char* Char(const char* p, const char* end, char c) { return p != nullptr && p != end && *p == c ? p + 1 : nullptr; }

// `[` integers separated by `,` `]`, possibly empty (a 0-d tensor's box).
template <typename IntVector>  // Dims or Shape
const char* IntList(const char* p, const char* end, IntVector* out) {
  if ((p = Char(p, end, '[')) == nullptr) return nullptr;
  if (p != end && *p == ']') return p + 1;
  while (true) {
    int64_t v = 0;
    if ((p = Signed(p, end, &v)) == nullptr || p == end) return nullptr;
    out->push_back(v);
    if (*p == ']') return p + 1;
    if (*p++ != ',') return nullptr;
  }
}

const char* Chunk(const char* p, const char* end, ChunkRecord* chunk) {
  uint64_t file = 0;
  if ((p = Char(p, end, '[')) == nullptr) return nullptr;
  p = Char(Unsigned(p, end, &file), end, ',');
  if (p == nullptr || file > UINT32_MAX) return nullptr;
  chunk->file = static_cast<uint32_t>(file);
  p = Char(Unsigned(p, end, &chunk->offset), end, ',');
  if (p != nullptr) p = Char(Unsigned(p, end, &chunk->bytes), end, ',');
  if (p == nullptr || p == end) return nullptr;
  Layout& layout = chunk->layout;
  if (*p == '[') {
    layout.kind = LayoutKind::kBox;
    p = Char(IntList(p, end, &layout.offsets), end, ',');
    if (p != nullptr) p = IntList(p, end, &layout.sizes);
  } else {
    layout.kind = LayoutKind::kFlatRange;
    p = Char(Signed(p, end, &layout.begin), end, ',');
    if (p != nullptr) p = Signed(p, end, &layout.end);
  }
  return Char(p, end, ']');
}

// The whole chunk list, appended to `out`.
const char* ChunkList(const char* p, const char* end, std::vector<ChunkRecord>* out) {
  if ((p = Char(p, end, '[')) == nullptr) return nullptr;
  if (p != end && *p == ']') return p + 1;
  while (true) {
    out->emplace_back();
    if ((p = Chunk(p, end, &out->back())) == nullptr || p == end) return nullptr;
    if (*p == ']') return p + 1;
    if (*p++ != ',') return nullptr;
  }
}

// `literal` itself.
inline const char* Literal(const char* p, const char* end, std::string_view literal) {
  if (p == nullptr || static_cast<size_t>(end - p) < literal.size() || std::memcmp(p, literal.data(), literal.size()) != 0) {
    return nullptr;
  }
  return p + literal.size();
}

// A string's bytes up to its closing quote (not consumed), when there is nothing to unescape and
// no control character (the general reader refuses those) and they are valid UTF-8 (which the
// general reader checks of the whole text, and never sees of this list).
const char* PlainString(const char* p, const char* end, std::string_view* out) {
  if (p == nullptr) return nullptr;
  const char* start = p;
  unsigned char any_high = 0;
  while (p != end && *p != '"') {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c == '\\') return nullptr;
    any_high |= c;
    ++p;
  }
  // ASCII is UTF-8: most names are, and a SIMD validation call per short name cost a tenth of
  // the decode.
  if (p == end || ((any_high & 0x80) != 0 && !simdjson::validate_utf8(start, static_cast<size_t>(p - start)))) {
    return nullptr;
  }
  *out = std::string_view(start, static_cast<size_t>(p - start));
  return p;
}

// `{"name": "N", "dtype": "D", "shape": [...], "chunks": [...]}`. `scratch` is reused from entry to
// entry, so that each entry's chunk list is allocated once, at its size, from `chunk_memory`.
const char* Entry(const char* p, const char* end, EntryRecord* e, std::vector<ChunkRecord>* scratch,
                  const ArenaAllocator<ChunkRecord>& chunk_memory) {
  std::string_view name, dtype;
  p = PlainString(Literal(p, end, "{\"name\": \""), end, &name);
  p = PlainString(Literal(p, end, "\", \"dtype\": \""), end, &dtype);
  if (p == nullptr) return nullptr;
  Result<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return nullptr;
  e->name.assign(name);
  e->dtype = *parsed;
  // Read into inline Dims first, so that the shape is allocated once at its size: pushed onto
  // the Shape, a 2-d one took two allocations and a free (a 20,000-entry decode, best of 30:
  // 7.7-8.0 -> 7.4 ms with the name and dtype read as views).
  Dims shape;
  p = IntList(Literal(p, end, "\", \"shape\": "), end, &shape);
  e->shape.assign(shape.begin(), shape.end());
  scratch->clear();
  p = ChunkList(Literal(p, end, ", \"chunks\": "), end, scratch);
  if ((p = Char(p, end, '}')) == nullptr) return nullptr;
  e->chunks = ChunkRecords(std::make_move_iterator(scratch->begin()), std::make_move_iterator(scratch->end()), chunk_memory);
  return p;
}

}  // namespace

size_t ReadCompactChunkList(std::string_view text, std::vector<ChunkRecord>* out) {
  const char* p = ChunkList(text.data(), text.data() + text.size(), out);
  return p == nullptr ? 0 : static_cast<size_t>(p - text.data());
}

namespace {

// Where the compact list at the start of `text` closes (its "\n ]") and an upper bound on its
// entries, to size the list once: grown one entry at a time, every entry was moved at each
// regrowth, onto fresh pages (a fifth of a 20,000-entry decode). Each entry starts a line, and a
// raw newline never stands inside a JSON string or anywhere in an entry this reader accepts, so
// the first "\n ]" closes the list, and the lines before it bound the entries. Capped by the
// shortest entry the reader accepts, so that a hostile text reserves (untouched) about one and a
// half times its own size at most. `close` is npos without that close: the list is not compact.
struct ListClose {
  size_t close = std::string_view::npos;
  size_t entries_bound = 0;
};
ListClose FindListClose(std::string_view text) {
  // `{"name": "a", "dtype": "bool", "shape": [], "chunks": []}` and its ",\n  " separator
  constexpr size_t kShortestEntry = 61;
  size_t lines = 0;
  for (size_t at = text.find('\n'); at != std::string_view::npos; at = text.find('\n', at + 1)) {
    if (text.compare(at, 3, "\n ]") == 0) return ListClose{at, std::min(lines, text.size() / kShortestEntry)};
    ++lines;
  }
  return ListClose{};
}

// The entries from `p` (an entry's '{') to `stop` (where a ",\n  " separator or the closing
// "\n ]" stands), appended to `out`: false unless they end exactly there. A large text's chunk
// lists go to an arena of this call's own, so that threads reading parts never share one.
bool EntriesUpTo(const char* p, const char* stop, std::vector<EntryRecord>* out) {
  std::vector<ChunkRecord> scratch;
  const ArenaAllocator<ChunkRecord> chunk_memory(
      static_cast<size_t>(stop - p) >= kArenaMinTextBytes ? std::make_shared<RecordArena>() : nullptr);
  while (true) {
    out->emplace_back();
    if ((p = Entry(p, stop, &out->back(), &scratch, chunk_memory)) == nullptr) return false;
    if (p == stop) return true;
    if ((p = Literal(p, stop, ",\n  ")) == nullptr) return false;
  }
}

// Below this, a thread's start costs more than it saves; past the most, a decode is held by its
// sequential parts (the callers ask for 4 at most).
constexpr size_t kBytesPerThread = size_t{1} << 20;
constexpr size_t kMostThreads = 16;

// The list's entries, [first, close), read by up to `threads` threads, each from a separator on:
// the grammar is a sequence of entries with one separator between each two, and every entry this
// reader accepts is one line, so reading from any separator on gives the entries a reading from
// the start gives, and the parts join exactly when each ends at the next part's separator.
bool EntriesInParallel(const char* first, const char* close, size_t threads, size_t entries_bound,
                       std::vector<EntryRecord>* out) {
  const std::string_view list(first, static_cast<size_t>(close - first));
  std::vector<const char*> starts = {first}, stops;
  for (size_t k = 1; k < threads; ++k) {
    const size_t from = std::max(list.size() * k / threads, static_cast<size_t>(starts.back() - first));
    const size_t separator = list.find(",\n  {", from);
    if (separator == std::string_view::npos) break;
    stops.push_back(first + separator);
    starts.push_back(first + separator + 4);
  }
  stops.push_back(close);
  const size_t parts = starts.size();
  std::vector<std::vector<EntryRecord>> read(parts);
  std::vector<char> ok(parts, 0);
  // What a part threw (std::bad_alloc), rethrown here as the one-thread read would throw it: out of
  // a helper thread it would end the process.
  std::vector<std::exception_ptr> thrown(parts);
  auto read_part = [&](size_t i) noexcept {
    try {
      read[i].reserve(entries_bound * static_cast<size_t>(stops[i] - starts[i]) / list.size() + 16);
      ok[i] = EntriesUpTo(starts[i], stops[i], &read[i]);
    } catch (...) {
      thrown[i] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(parts);
  for (size_t i = 1; i < parts; ++i) {
    try {
      helpers.emplace_back(read_part, i);
    } catch (const std::system_error&) {
      read_part(i);  // no thread to be had (a pids limit): read it here
    }
  }
  read_part(0);
  for (std::thread& helper : helpers) helper.join();
  for (const std::exception_ptr& e : thrown) {
    if (e) std::rethrow_exception(e);
  }
  if (std::find(ok.begin(), ok.end(), 0) != ok.end()) return false;
  size_t total = 0;
  for (const auto& part : read) total += part.size();
  out->reserve(total);
  for (auto& part : read) std::move(part.begin(), part.end(), std::back_inserter(*out));
  return true;
}

}  // namespace

size_t ReadCompactEntryList(std::string_view text, std::vector<EntryRecord>* out, size_t threads) {
  const char* const begin = text.data();
  const char* const end = begin + text.size();
  out->clear();
  if (const char* p = Literal(begin, end, "[]")) return static_cast<size_t>(p - begin);
  const char* first = Literal(begin, end, "[\n  ");
  if (first == nullptr) return 0;
  const ListClose list = FindListClose(text);
  if (list.close == std::string_view::npos) return 0;  // after `first`: "[\n  " holds no "\n ]"
  const char* close = begin + list.close;
  const size_t useful_threads =
      std::min({threads, kMostThreads, static_cast<size_t>(close - first) / kBytesPerThread});
  bool read = false;
  if (useful_threads > 1) {
    read = EntriesInParallel(first, close, useful_threads, list.entries_bound, out);
  } else {
    out->reserve(list.entries_bound);
    read = EntriesUpTo(first, close, out);
  }
  return read ? list.close + 3 : 0;
}

}  // namespace shardckpt
