#include "shardckpt/engine/model/manifest.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_set>

#include "shardckpt/engine/model/chunk_list_text.h"
#include "shardckpt/engine/model/chunk_packing.h"
#include "shardckpt/engine/model/coverage.h"
#include "shardckpt/engine/model/json_text.h"
#include "shardckpt/engine/model/name_index.h"
#include "shardckpt/io/checksum.h"

namespace shardckpt {
namespace {

namespace od = simdjson::ondemand;

// The manifest checks itself: its last field is the XXH3 of the text without that field, so a
// flipped bit anywhere in it (metadata included) is detected like one in a data block.
constexpr std::string_view kSealKey = ",\n \"checksum\": \"xxh3:";
constexpr std::string_view kSealEnd = "\"\n}";
constexpr size_t kSealTail = kSealKey.size() + 16 + kSealEnd.size();

// kReformatted: the field is there, but its line breaks or spacing are not those written (an
// editor's save that turned the line endings into CRLF, or spaces into tabs): the bytes are no
// longer those sealed.
enum class SealShape { kMissing, kReformatted, kDamaged, kPresent };

// Whether `text` ends with a seal; if so, the recorded checksum. The sealed text is
// text[0, size - kSealTail) followed by "\n}".
SealShape FindSeal(const std::string& text, uint64_t* recorded) {
  if (text.size() < kSealTail || text.compare(text.size() - kSealTail, kSealKey.size(), kSealKey) != 0 ||
      text.compare(text.size() - kSealEnd.size(), kSealEnd.size(), kSealEnd) != 0) {
    // Reformatted: the field is there and the tail holds a CR or a tab, which the writer never
    // puts there. A field cut short or with a digit gone stays "missing or damaged".
    const size_t tail = text.size() < 2 * kSealTail ? 0 : text.size() - 2 * kSealTail;
    const bool field = text.find("\"checksum\": \"xxh3:", tail) != std::string::npos;
    const bool respaced = text.find_first_of("\r\t", tail) != std::string::npos;
    return field && respaced ? SealShape::kReformatted : SealShape::kMissing;
  }
  if (!ParseHex64(text.substr(text.size() - kSealEnd.size() - 16, 16), recorded)) return SealShape::kDamaged;
  return SealShape::kPresent;
}

Status SealError(SealShape shape, const std::string& origin) {
  if (shape == SealShape::kMissing) return DataLoss(origin + ": the manifest's checksum field is missing or damaged");
  if (shape == SealShape::kReformatted) {
    return DataLoss(origin + ": the manifest was reformatted around its checksum field (line endings or spacing "
                             "changed, as an editor's save may): its bytes are no longer those sealed");
  }
  if (shape == SealShape::kDamaged) return DataLoss(origin + ": the manifest's checksum field is damaged");
  return DataLoss(origin + ": manifest checksum mismatch: the file is corrupt or was edited");
}

// ---- Encoding: the text is written directly (json_text.h), no DOM ----

template <typename IntVector>  // Shape or Dims
void AppendIntList(std::string* out, const IntVector& values) {
  out->push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out->push_back(',');
    AppendJsonInt(out, values[i]);
  }
  out->push_back(']');
}

// A chunk's text is written into a local buffer and appended once: appending its dozen numbers
// and brackets to the string one by one was most of an encode (millions of chunks).
constexpr size_t kNumberText = 21;  // an int64 or uint64 and its separator

char* PutUint(char* p, uint64_t value) { return std::to_chars(p, p + kNumberText, value).ptr; }
char* PutInt(char* p, int64_t value) { return std::to_chars(p, p + kNumberText, value).ptr; }

template <typename IntVector>  // Shape or Dims
char* PutIntList(char* p, const IntVector& values) {
  *p++ = '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) *p++ = ',';
    p = PutInt(p, values[i]);
  }
  *p++ = ']';
  return p;
}

// Zeros of a box offset for a Whole chunk, written as the full box.
char* PutZeros(char* p, size_t n) {
  *p++ = '[';
  for (size_t i = 0; i < n; ++i) {
    if (i) *p++ = ',';
    *p++ = '0';
  }
  *p++ = ']';
  return p;
}

// [file, offset, bytes, begin, end] for a flat range, [file, offset, bytes, [offsets], [sizes]] for
// a box; a replicated (Whole) chunk as the full box.
void AppendChunk(std::string* out, const ChunkRecord& chunk, const Shape& shape) {
  const size_t dims = std::max(chunk.layout.offsets.size() + chunk.layout.sizes.size(), 2 * shape.size());
  const size_t bound = (5 + dims) * kNumberText + 8;
  char local[512];
  std::vector<char> large;  // more dims than the local buffer holds: rare
  char* const start = bound <= sizeof(local) ? local : (large.resize(bound), large.data());
  char* p = start;
  *p++ = '[';
  p = PutUint(p, chunk.file);
  *p++ = ',';
  p = PutUint(p, chunk.offset);
  *p++ = ',';
  p = PutUint(p, chunk.bytes);
  *p++ = ',';
  switch (chunk.layout.kind) {
    case LayoutKind::kFlatRange:
      p = PutInt(p, chunk.layout.begin);
      *p++ = ',';
      p = PutInt(p, chunk.layout.end);
      break;
    case LayoutKind::kBox:
      p = PutIntList(p, chunk.layout.offsets);
      *p++ = ',';
      p = PutIntList(p, chunk.layout.sizes);
      break;
    case LayoutKind::kWhole:
      p = PutZeros(p, shape.size());
      *p++ = ',';
      p = PutIntList(p, shape);
      break;
  }
  *p++ = ']';
  out->append(start, static_cast<size_t>(p - start));
}

std::string SumsToHex(const std::vector<uint64_t>& sums) {
  std::string out;
  out.reserve(sums.size() * 16);
  for (uint64_t s : sums) out += Hex64(s);
  return out;
}

// ---- Decoding: simdjson On-Demand, straight into the Manifest, no DOM ----

// Every refusal below is thrown (std::runtime_error) and caught once in Decode, which names the
// file and the part of the manifest (header, files[i], entry 'name', blobs[i]).
[[noreturn]] void Refuse(const std::string& why) { throw std::runtime_error(why); }

// Errors of the JSON text itself (syntax, encoding, nesting, truncation).
void Check(simdjson::error_code error) {
  if (error) Refuse(std::string("invalid JSON: ") + simdjson::error_message(error));
}

constexpr int kMaxNesting = 64;

// How `v`, which did not convert to an integer, is written: as an integer too large (positive)
// or too small (negative) for the type, or as something else (a fraction, an exponent, leading
// zeros, not a number). Said so rather than "not an integer" (simdjson's error codes for an
// integer out of range differ between its versions).
enum class IntegerText { kNone, kTooLarge, kTooSmall };
IntegerText WrittenAsInteger(od::value& v) {
  std::string_view text = v.raw_json_token();
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\r' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  const bool negative = !text.empty() && text.front() == '-';
  if (negative) text.remove_prefix(1);
  const bool digits = !text.empty() && (text.front() != '0' || text.size() == 1) &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return IntegerText::kNone;
  return negative ? IntegerText::kTooSmall : IntegerText::kTooLarge;
}

uint64_t U64(od::value& v, const char* what) {
  uint64_t x = 0;
  if (v.get_uint64().get(x)) {
    Refuse(std::string(what) + (WrittenAsInteger(v) == IntegerText::kTooLarge ? " is an integer out of range (past 2^64 - 1)"
                                                                              : " is not a non-negative integer"));
  }
  return x;
}

int64_t I64(od::value& v, const std::string& what) {
  int64_t x = 0;
  if (v.get_int64().get(x)) {
    switch (WrittenAsInteger(v)) {
      case IntegerText::kTooLarge: Refuse(what + " an integer out of range (past 2^63 - 1)");
      case IntegerText::kTooSmall: Refuse(what + " an integer out of range (below -2^63)");
      case IntegerText::kNone: Refuse(what + " a non-integer");
    }
  }
  return x;
}

// File indexes and ranks: `too_large` when past `limit`.
uint64_t U64AtMost(od::value& v, const char* what, uint64_t limit, const char* too_large) {
  const uint64_t x = U64(v, what);
  if (x > limit) Refuse(too_large);
  return x;
}

std::string_view Str(od::value& v, const char* what) {
  std::string_view s;
  if (v.get_string().get(s)) Refuse(std::string(what) + " is not a string");
  return s;
}

od::json_type TypeOf(od::value& v) {
  od::json_type type{};
  Check(v.type().get(type));
  return type;
}

const char* TypeName(od::json_type type) {
  switch (type) {
    case od::json_type::array: return "array";
    case od::json_type::object: return "object";
    case od::json_type::number: return "number";
    case od::json_type::string: return "string";
    case od::json_type::boolean: return "boolean";
    case od::json_type::null: return "null";
  }
  return "unknown";
}

template <typename Each>
void ForEachElement(od::value& list, const char* what, Each&& each) {
  od::array items;
  if (list.get_array().get(items)) Refuse(std::string(what) + " is not a list");
  for (auto element : items) {
    od::value v;
    Check(element.get(v));
    each(v);
  }
}

template <typename Each>
void ForEachField(od::value& object, const char* what, Each&& each) {
  od::object fields;
  if (object.get_object().get(fields)) Refuse(std::string(what) + " is not an object");
  for (auto field : fields) {
    std::string_view key;
    Check(field.unescaped_key().get(key));
    od::value v;
    Check(field.value().get(v));
    each(key, v);
  }
}

// A value the reader does not use (unknown fields, "chunk_fields", the seal): still checked to be
// valid JSON, as a full parse would.
void Consume(od::value& v, int depth = 0) {
  if (depth >= kMaxNesting) Refuse("values nested more than " + std::to_string(kMaxNesting) + " deep");
  switch (TypeOf(v)) {
    case od::json_type::array:
      ForEachElement(v, "value", [&](od::value& x) { Consume(x, depth + 1); });
      break;
    case od::json_type::object:
      ForEachField(v, "value", [&](std::string_view, od::value& x) { Consume(x, depth + 1); });
      break;
    case od::json_type::number: {
      double d;
      Check(v.get_double().get(d));
      break;
    }
    case od::json_type::string: {
      std::string_view s;
      Check(v.get_string().get(s));
      break;
    }
    case od::json_type::boolean: {
      bool b;
      Check(v.get_bool().get(b));
      break;
    }
    case od::json_type::null: {
      bool null = false;
      Check(v.is_null().get(null));
      if (!null) Refuse("invalid JSON: a value starting with 'n' is not null");
      break;
    }
  }
}

// Replaces `out` with the list. Shapes and boxes have a few dims: gathered on the stack first, so
// that the vector is allocated once, at its size (millions of chunks hold two lists each).
template <typename IntVector>  // Shape or Dims
void IntList(od::value& v, const char* what, IntVector* out) {
  constexpr size_t kSmall = 8;
  int64_t small[kSmall];
  size_t n = 0;
  ForEachElement(v, what, [&](od::value& x) {
    const int64_t i = I64(x, std::string(what) + " holds");
    if (n < kSmall) {
      small[n++] = i;
      return;
    }
    if (n++ == kSmall) out->assign(small, small + kSmall);
    out->push_back(i);
  });
  if (n <= kSmall) out->assign(small, small + n);
}

// Known fields of one object, each allowed once (a field given twice is refused rather than
// silently taking one of the two).
class Fields {
 public:
  explicit Fields(std::initializer_list<std::string_view> names) : names_(names) {}
  // The index of `key` among the names, or -1 for an unknown field.
  int Take(std::string_view key) {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == key) {
        if (seen_ & (1u << i)) Refuse("field '" + std::string(key) + "' appears twice");
        seen_ |= 1u << i;
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  bool Has(int index) const { return seen_ & (1u << index); }
  void Require(int index) const {
    if (!Has(index)) Refuse("missing field '" + std::string(names_[index]) + "'");
  }

 private:
  std::vector<std::string_view> names_;
  uint32_t seen_ = 0;
};

std::vector<uint64_t> HexToSums(std::string_view hex) {
  if (hex.size() % 16 != 0) Refuse("table_sums length is not a multiple of 16");
  std::vector<uint64_t> sums(hex.size() / 16);
  for (size_t i = 0; i < sums.size(); ++i) {
    if (!ParseHex64(std::string(hex.substr(i * 16, 16)), &sums[i])) Refuse("table_sums is not hex");
  }
  return sums;
}

void DecodeChunk(od::value& v, ChunkRecord* chunk) {
  size_t k = 0;
  bool box = false;
  Dims offsets, sizes;
  int64_t begin = 0, end = 0;
  auto bound = [](od::value& x) { return I64(x, "a flat range bound is"); };
  ForEachElement(v, "chunk", [&](od::value& x) {
    switch (k++) {
      case 0:
        chunk->file = static_cast<uint32_t>(U64AtMost(x, "chunk file", UINT32_MAX, "chunk file index too large"));
        break;
      case 1: chunk->offset = U64(x, "chunk offset"); break;
      case 2: chunk->bytes = U64(x, "chunk bytes"); break;
      case 3:
        box = TypeOf(x) == od::json_type::array;
        if (box) {
          IntList(x, "box offsets", &offsets);
        } else {
          begin = bound(x);
        }
        break;
      case 4:
        if (box) {
          IntList(x, "box sizes", &sizes);
        } else {
          end = bound(x);
        }
        break;
      default: Refuse("chunk is not a 5-element list");
    }
  });
  if (k != 5) Refuse("chunk is not a 5-element list");
  chunk->layout = box ? Layout::Box(std::move(offsets), std::move(sizes)) : Layout::FlatRange(begin, end);
}

// Informational: fields of another type are ignored (but must be valid JSON).
void DecodeCreated(od::value& v, CreationInfo* c) {
  auto text = [](od::value& x, std::string* out) {
    if (TypeOf(x) == od::json_type::string) {
      *out = std::string(Str(x, "text"));
    } else {
      Consume(x);
    }
  };
  ForEachField(v, "created", [&](std::string_view key, od::value& x) {
    if (key == "time") {
      text(x, &c->time);
    } else if (key == "shardckpt_version") {
      text(x, &c->shardckpt_version);
    } else if (key == "torch_version") {
      text(x, &c->torch_version);
    } else if (key == "git_commit") {
      text(x, &c->git_commit);
    } else if (key == "hosts") {
      int64_t hosts = 0;
      if (TypeOf(x) == od::json_type::number && !x.get_int64().get(hosts) && hosts >= INT_MIN && hosts <= INT_MAX) {
        c->hosts = static_cast<int>(hosts);
      } else {
        Consume(x);
      }
    } else if (key == "user" && TypeOf(x) == od::json_type::object) {
      ForEachField(x, "user", [&](std::string_view name, od::value& y) {
        if (TypeOf(y) == od::json_type::string) {
          c->user[std::string(name)] = std::string(Str(y, "user value"));
        } else {
          Consume(y);
        }
      });
    } else {
      Consume(x);
    }
  });
}

void DecodeFile(od::value& v, FileRecord* f) {
  Fields fields({"name", "size", "table_offset", "table_sums", "checksums"});
  ForEachField(v, "a file record", [&](std::string_view key, od::value& x) {
    switch (fields.Take(key)) {
      case 0: f->name = std::string(Str(x, "name")); break;
      case 1: f->size = U64(x, "size"); break;
      case 2: f->table_offset = U64(x, "table_offset"); break;
      case 3: f->table_page_sums = HexToSums(Str(x, "table_sums")); break;
      case 4:
        // Only a manifest built in memory from a DCP folder has files without checksums (its
        // text shows them for inspection); one on disk that claims so would skip verification.
        Refuse("'checksums' is not allowed in a manifest on disk");
      default: Consume(x);
    }
  });
  for (int i = 0; i < 4; ++i) fields.Require(i);
}

// An entry's chunk list into `out`: read from the text directly when it is in the form this
// writer uses (chunk_list_text.h), else value by value. `text_end`: the end of the parsed text.
void DecodeChunkList(od::value& v, const char* text_end, std::vector<ChunkRecord>* out) {
  const char* start = v.raw_json_token().data();
  out->clear();
  const size_t length = ReadCompactChunkList(std::string_view(start, static_cast<size_t>(text_end - start)), out);
  if (length == 0) {
    out->clear();
    ForEachElement(v, "chunks", [&](od::value& c) {
      out->emplace_back();
      DecodeChunk(c, &out->back());
    });
    return;
  }
  // Skip the list in the parser too, and make sure it ends where the compact reader's did.
  od::array list;
  std::string_view raw;
  if (v.get_array().get(list)) Refuse("chunks is not a list");
  Check(list.raw_json().get(raw));
  while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' || raw.back() == '\t')) {
    raw.remove_suffix(1);
  }
  if (raw.data() != start || raw.size() != length) Refuse("the chunk list does not end where its brackets do");
}

// `scratch`: reused from entry to entry, so that each entry's chunk list is allocated once.
void DecodeEntry(od::value& v, const char* text_end, EntryRecord* e, std::vector<ChunkRecord>* scratch) {
  Fields fields({"name", "dtype", "shape", "chunks"});
  ForEachField(v, "an entry", [&](std::string_view key, od::value& x) {
    switch (fields.Take(key)) {
      case 0:
        e->name = std::string(Str(x, "name"));
        break;
      case 1: {
        Result<DType> dtype = ParseDType(std::string(Str(x, "dtype")));
        if (!dtype.ok()) Refuse(dtype.status().message());
        e->dtype = *dtype;
        break;
      }
      case 2: IntList(x, "shape", &e->shape); break;
      case 3:
        DecodeChunkList(x, text_end, scratch);
        e->chunks.assign(std::make_move_iterator(scratch->begin()), std::make_move_iterator(scratch->end()));
        break;
      default: Consume(x);
    }
  });
  for (int i = 0; i < 4; ++i) fields.Require(i);
}

void DecodeBlob(od::value& v, BlobRecord* b) {
  Fields fields({"name", "scope", "rank", "file", "offset", "bytes"});
  ForEachField(v, "a blob record", [&](std::string_view key, od::value& x) {
    switch (fields.Take(key)) {
      case 0: b->name = std::string(Str(x, "name")); break;
      case 1: {
        std::string_view scope = Str(x, "scope");
        if (scope != "global" && scope != "per_rank") Refuse("unknown blob scope '" + std::string(scope) + "'");
        b->scope = scope == "global" ? BlobScope::kGlobal : BlobScope::kPerRank;
        break;
      }
      case 2: b->rank = static_cast<int>(U64AtMost(x, "rank", kMaxWorldSize, "rank or file out of range")); break;
      case 3: b->file = static_cast<uint32_t>(U64AtMost(x, "file", UINT32_MAX, "rank or file out of range")); break;
      case 4: b->offset = U64(x, "offset"); break;
      case 5: b->bytes = U64(x, "bytes"); break;
      default: Consume(x);
    }
  });
  for (int i = 0; i < 6; ++i) fields.Require(i);
}

// Where in the manifest a refusal is, named only when there is one.
struct Place {
  const char* list = nullptr;  // null: the header
  size_t index = 0;
  const std::string* name = nullptr;  // an entry's name once read

  std::string ToString() const {
    if (list == nullptr) return "header";
    if (name != nullptr && !name->empty()) return "entry '" + *name + "'";
    if (index == SIZE_MAX) return list;
    return std::string(list) + "[" + std::to_string(index) + "]";
  }
};

// The sealed text's body: all of it before the seal (which stands in for its closing "\n}").
std::string_view SealedBody(const std::string& text) { return std::string_view(text).substr(0, text.size() - kSealTail); }

// The text simdjson parses: the sealed text without its seal (a copy is needed anyway for
// simdjson's padding), or the whole text when it has no seal.
simdjson::padded_string ParsedText(const std::string& text, SealShape seal) {
  if (seal != SealShape::kPresent) return simdjson::padded_string(text);
  const std::string_view body = SealedBody(text);
  simdjson::padded_string out(body.size() + 2);
  std::memcpy(out.data(), body.data(), body.size());
  std::memcpy(out.data() + body.size(), "\n}", 2);
  return out;
}

// The entries list, read ahead of the general reader when it is spelled as EncodeManifest spells
// it (ReadCompactEntryList): where its '[' stands in the text, its length, and its entries.
struct CompactEntries {
  size_t open = 0;
  size_t length = 0;
  std::vector<EntryRecord> entries;
};

// The list after the first `,\n "entries": `. A raw newline never stands inside a JSON string, but
// the key could still stand inside a nested object: DecodeText checks that the top-level
// "entries" is the list read here.
bool ReadCompactEntries(std::string_view body, CompactEntries* out, size_t threads) {
  constexpr std::string_view kKey = ",\n \"entries\": ";
  const size_t key = body.find(kKey);
  if (key == std::string_view::npos) return false;
  out->open = key + kKey.size();
  out->length = ReadCompactEntryList(body.substr(out->open), &out->entries, threads);
  return out->length != 0;
}

// The sealed text with the compact entries list cut down to `[]`: simdjson never indexes or skips
// what is nearly all of a large manifest's text.
simdjson::padded_string TextWithoutEntries(const std::string& text, const CompactEntries& compact) {
  const std::string_view body = SealedBody(text);
  const std::string_view after = body.substr(compact.open + compact.length);
  simdjson::padded_string out(compact.open + 2 + after.size() + 2);
  char* p = out.data();
  std::memcpy(p, body.data(), compact.open);
  p += compact.open;
  std::memcpy(p, "[]", 2);
  std::memcpy(p + 2, after.data(), after.size());
  std::memcpy(p + 2 + after.size(), "\n}", 2);
  return out;
}

// Decodes `text`. With `compact`, the entries are those read ahead and the rest of the text is
// parsed without them; a refusal then is discarded, and the caller decodes again without
// `compact`, so that every error comes from the general path, named as it names it.
Result<Manifest> DecodeText(const std::string& text, SealShape seal, uint64_t recorded, CompactEntries* compact,
                            const std::string& origin, size_t threads) {
  Manifest m;
  Place where;
  try {
    const simdjson::padded_string parsed = compact != nullptr ? TextWithoutEntries(text, *compact) : ParsedText(text, seal);
    const simdjson::padded_string_view view = parsed;
    od::parser parser;
    od::document doc;
    Check(parser.iterate(view).get(doc));
    // First the format and version (an older layout has them after the entries), which decide
    // what the rest means; then the seal; then everything else in one pass.
    od::object root;
    simdjson::error_code not_object = doc.get_object().get(root);
    if (not_object == simdjson::INCORRECT_TYPE) return DataLoss(origin + ": not a shardckpt manifest");
    Check(not_object);
    std::string format;
    std::vector<int64_t> version;
    bool has_format = false, has_version = false;
    for (auto field : root) {
      std::string_view key;
      Check(field.unescaped_key().get(key));
      od::value v;
      Check(field.value().get(v));
      if (key == "format" && !has_format) {
        std::string_view s;
        has_format = !v.get_string().get(s);
        format = s;
      } else if (key == "format_version" && !has_version) {
        IntList(v, "format_version", &version);
        has_version = true;
      }
      if (has_format && has_version) break;
    }
    if (!has_format || format != kFormatName) return DataLoss(origin + ": not a shardckpt manifest");
    if (!has_version) Refuse("missing field 'format_version'");
    if (version.size() != 2 || version[1] < 0 || version[1] > INT_MAX) {
      return DataLoss(origin + ": format_version must be [major, minor]");
    }
    if (version[0] != kFormatMajor) {
      return Status(Code::kFailedPrecondition,
                    origin + ": format version " + std::to_string(version[0]) + "." +
                        std::to_string(version[1]) + " is not supported by this shardckpt (reads " +
                        std::to_string(kFormatMajor) + ".x); upgrade shardckpt");
    }
    m.format_major = static_cast<int>(version[0]);
    m.format_minor = static_cast<int>(version[1]);
    if (seal != SealShape::kPresent || Checksum64({SealedBody(text), "\n}"}) != recorded) {
      return SealError(seal, origin);
    }

    doc.rewind();
    Check(doc.get_object().get(root));
    Fields fields({"format", "format_version", "step", "world_size", "created", "metrics", "files",
                   "entries", "blobs"});
    std::vector<ChunkRecord> scratch;
    for (auto field : root) {
      std::string_view key;
      Check(field.unescaped_key().get(key));
      od::value v;
      Check(field.value().get(v));
      where = Place{};
      switch (fields.Take(key)) {
        case 0:
        case 1: break;  // read above
        case 2: {
          m.step = I64(v, "step is");
          break;
        }
        case 3: {
          uint64_t world = U64(v, "world_size");
          if (world == 0 || world > kMaxWorldSize) Refuse("world_size out of range");
          m.world_size = static_cast<int>(world);
          break;
        }
        case 4:
          if (TypeOf(v) == od::json_type::object) {
            DecodeCreated(v, &m.created);
          } else {
            Consume(v);
          }
          break;
        case 5:
          where = Place{"metrics", SIZE_MAX};
          if (TypeOf(v) != od::json_type::object) Refuse("not an object of named numbers");
          ForEachField(v, "metrics", [&](std::string_view name, od::value& x) {
            od::json_type type = TypeOf(x);
            double value = 0;
            if (type != od::json_type::number) Refuse("metric '" + std::string(name) + "' is " + TypeName(type) + ", not a number");
            // A number out of a double's range (1e999): simdjson refuses it rather than make it inf.
            if (x.get_double().get(value)) Refuse("metric '" + std::string(name) + "' is a number out of a double's range");
            m.metrics[std::string(name)] = value;
          });
          break;
        case 6: {
          size_t i = 0;
          ForEachElement(v, "files", [&](od::value& x) {
            where = Place{"files", i++};
            m.files.emplace_back();
            DecodeFile(x, &m.files.back());
          });
          break;
        }
        case 7: {
          if (compact != nullptr) {
            if (v.raw_json_token().data() != parsed.data() + compact->open) Refuse("not the entries read ahead");
            Consume(v);
            m.entries = std::move(compact->entries);
            break;
          }
          size_t i = 0;
          ForEachElement(v, "entries", [&](od::value& x) {
            m.entries.emplace_back();
            where = Place{"entries", i++, &m.entries.back().name};
            DecodeEntry(x, parsed.data() + parsed.size(), &m.entries.back(), &scratch);
          });
          break;
        }
        case 8: {
          size_t i = 0;
          ForEachElement(v, "blobs", [&](od::value& x) {
            where = Place{"blobs", i++};
            m.blobs.emplace_back();
            DecodeBlob(x, &m.blobs.back());
          });
          break;
        }
        default: Consume(v);
      }
    }
    where = Place{};
    for (int i : {2, 3, 6, 7, 8}) fields.Require(i);
    const char* after = nullptr;
    if (!doc.current_location().get(after)) Refuse("text after the manifest's closing brace");
  } catch (const std::exception& e) {
    return DataLoss(origin + ": malformed manifest at " + where.ToString() + ": " + e.what());
  }
  Status valid = ValidateManifest(m, threads);
  if (!valid.ok()) return valid.WithContext(origin);
  return m;
}

}  // namespace

namespace {

Result<Manifest> DecodeManifestUnguarded(const std::string& text, const std::string& origin, size_t threads) {
  uint64_t recorded = 0;
  const SealShape seal = FindSeal(text, &recorded);
  // Past simdjson's largest document the general path refuses the text; so does this one, though
  // the text without its entries would fit.
  if (seal == SealShape::kPresent && text.size() <= simdjson::SIMDJSON_MAXSIZE_BYTES) {
    CompactEntries compact;
    if (ReadCompactEntries(SealedBody(text), &compact, threads)) {
      Result<Manifest> m = DecodeText(text, seal, recorded, &compact, origin, threads);
      if (m.ok()) return m;
    }
    // Whatever was refused, the general reader refuses it again and names it where it is. A
    // damaged or hostile manifest is read twice then, but never held twice: `compact` is gone.
  }
  return DecodeText(text, seal, recorded, nullptr, origin, threads);
}

}  // namespace

Status OutOfMemoryDecoding(const std::string& origin, size_t text_bytes) {
  return Status(Code::kInternal, origin + ": out of memory decoding the manifest (" + std::to_string(text_bytes) +
                                     " bytes); give this process more memory");
}

namespace {

// The length of `text` without whitespace after its closing brace (an editor's final newline:
// vim's 'fixeol' adds one on every save), which changes no JSON; npos when there is none.
size_t LengthWithoutTrailingSpace(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == ' ' || text[end - 1] == '\t' || text[end - 1] == '\r')) {
    --end;
  }
  return end < text.size() && end > 0 && text[end - 1] == '}' ? end : std::string::npos;
}

}  // namespace

Result<Manifest> DecodeManifest(const std::string& text, const std::string& origin, size_t threads) {
  // Out of memory is the one failure a manifest within the size limit can still meet (a rank's
  // memory limit): as a Status every rank hears of it, where a throw would leave the others
  // waiting in the next collective.
  try {
    // Copied without the whitespace (a rare manifest: one an editor saved).
    if (const size_t end = LengthWithoutTrailingSpace(text); end != std::string::npos) {
      return DecodeManifestUnguarded(text.substr(0, end), origin, threads);
    }
    return DecodeManifestUnguarded(text, origin, threads);
  } catch (const std::bad_alloc&) {
    return OutOfMemoryDecoding(origin, text.size());
  }
}

namespace {

// The last field and closing brace of a manifest whose text without them has checksum `sum`.
std::string SealField(uint64_t sum) {
  std::string field(kSealKey);
  field.append(Hex64(sum));
  field.append(kSealEnd);
  return field;
}

}  // namespace

std::string SealManifestText(std::string text) {
  // `text` is a JSON object whose text ends with "\n}" (EncodeManifest's, or an older writer's).
  const uint64_t sum = Checksum64(text.data(), text.size());
  text.resize(text.size() >= 2 ? text.size() - 2 : 0);
  text.append(SealField(sum));
  return text;
}

Result<std::string> CheckSeal(const std::string& text, const std::string& origin) {
  if (const size_t end = LengthWithoutTrailingSpace(text); end != std::string::npos) {
    return CheckSeal(text.substr(0, end), origin);
  }
  uint64_t recorded = 0;
  SealShape seal = FindSeal(text, &recorded);
  if (seal != SealShape::kPresent) return SealError(seal, origin);
  std::string original = text.substr(0, text.size() - kSealTail) + "\n}";
  if (Checksum64(original.data(), original.size()) != recorded) return SealError(seal, origin);
  return original;
}

uint64_t TablePages(uint64_t table_offset) {
  uint64_t blocks = table_offset / kBlockSize;
  return (blocks + kSumsPerTablePage - 1) / kSumsPerTablePage;
}

uint64_t DataFileSize(uint64_t table_offset) { return table_offset + TablePages(table_offset) * kBlockSize; }

bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    if (c == '/' || c == '\\' || c == '\0') return false;
  }
  return true;
}

bool UsesPackedOffsets(const Manifest& m) {
  for (const EntryRecord& e : m.entries) {
    for (const ChunkRecord& c : e.chunks) {
      if (IsPackedOffset(c.offset)) return true;
    }
  }
  for (const BlobRecord& b : m.blobs) {
    if (IsPackedOffset(b.offset)) return true;
  }
  return false;
}

namespace {

Status RefuseNonUtf8(const std::string& what) {
  return InvalidArgument("cannot encode manifest (names must be UTF-8): " + what + " is not valid UTF-8");
}

// A top-level field after the first.
void AppendKey(std::string* out, const char* name) {
  out->append(",\n \"");
  out->append(name);
  out->append("\": ");
}

size_t BodyBytesEstimate(const Manifest& m) {
  size_t chunks = 0, names = 0;
  for (const EntryRecord& e : m.entries) {
    chunks += e.chunks.size();
    names += e.name.size() + 8 * e.shape.size();
  }
  return m.entries.size() * 80 + names + chunks * 48 + m.blobs.size() * 128;
}

// The fields that say what the files hold: "chunk_fields", "entries" and "blobs", in three steps
// (ManifestBodyBuilder writes the entries one at a time).
void AppendEntriesOpening(std::string& out) {
  AppendKey(&out, "chunk_fields");
  AppendJsonString(&out, "[file, offset, bytes, begin|box_offsets, end|box_sizes]");
  AppendKey(&out, "entries");
  out.push_back('[');
}

// Entry `e`, the `index`th of the list.
Status AppendEntry(std::string& out, const EntryRecord& e, size_t index) {
  out.append(index ? ",\n  {\"name\": " : "\n  {\"name\": ");
  if (!AppendJsonString(&out, e.name)) return RefuseNonUtf8("the name of entry " + std::to_string(index));
  out.append(", \"dtype\": \"");
  out.append(DTypeName(e.dtype));
  out.append("\", \"shape\": ");
  AppendIntList(&out, e.shape);
  out.append(", \"chunks\": [");
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    if (k) out.push_back(',');
    AppendChunk(&out, e.chunks[k], e.shape);
  }
  out.append("]}");
  return Status::Ok();
}

// Closes a list of `entries` entries and writes the blobs.
Status AppendEntriesClosingAndBlobs(std::string& out, size_t entries, const std::vector<BlobRecord>& blobs) {
  out.append(entries == 0 ? "]" : "\n ]");
  AppendKey(&out, "blobs");
  out.push_back('[');
  for (size_t i = 0; i < blobs.size(); ++i) {
    const BlobRecord& b = blobs[i];
    out.append(i ? ",\n  {\"name\": " : "\n  {\"name\": ");
    if (!AppendJsonString(&out, b.name)) return RefuseNonUtf8("the name of blob " + std::to_string(i));
    out.append(b.scope == BlobScope::kGlobal ? ", \"scope\": \"global\", \"rank\": " : ", \"scope\": \"per_rank\", \"rank\": ");
    AppendJsonInt(&out, b.rank);
    out.append(", \"file\": ");
    AppendJsonUint(&out, b.file);
    out.append(", \"offset\": ");
    AppendJsonUint(&out, b.offset);
    out.append(", \"bytes\": ");
    AppendJsonUint(&out, b.bytes);
    out.push_back('}');
  }
  out.append(blobs.empty() ? "]" : "\n ]");
  return Status::Ok();
}

Status AppendBody(const Manifest& m, std::string& out) {
  AppendEntriesOpening(out);
  for (size_t i = 0; i < m.entries.size(); ++i) SC_RETURN_IF_ERROR(AppendEntry(out, m.entries[i], i));
  return AppendEntriesClosingAndBlobs(out, m.entries.size(), m.blobs);
}

// The text without its seal, then sealed (docs/format.md, "manifest.json"): the top-level fields
// one per line, then each file, entry and blob on a line of its own, lists of numbers without
// spaces. The head (format, step, creation, metrics, files) is written here, the entries and
// blobs by `append_body`, without the closing brace and seal. Written straight into one string:
// a million chunks take tens of milliseconds.
template <typename AppendBodyFn>
Result<std::string> EncodeUnsealed(const Manifest& m, bool packed_offsets, size_t body_bytes,
                                   AppendBodyFn append_body) {
  size_t sums = 0;
  for (const FileRecord& f : m.files) sums += f.table_page_sums.size();
  std::string out;
  out.reserve(1024 + m.files.size() * 128 + sums * 16 + body_bytes);
  auto refuse = RefuseNonUtf8;
  auto key = [&](const char* name) { AppendKey(&out, name); };
  out.append("{\n \"format\": ");
  AppendJsonString(&out, kFormatName);
  key("format_version");
  // The lowest version that describes the files: 1.0 readers can still read a checkpoint
  // without packed chunks, and refuse one with them (their validation wants every offset on a block).
  out.push_back('[');
  AppendJsonInt(&out, m.format_major);
  out.append(", ");
  AppendJsonInt(&out, packed_offsets ? kFormatMinorPacked : 0);
  out.push_back(']');
  key("step");
  AppendJsonInt(&out, m.step);
  key("world_size");
  AppendJsonInt(&out, m.world_size);
  key("created");
  const CreationInfo& c = m.created;
  bool ok = true;
  out.append("{\"time\": ");
  ok &= AppendJsonString(&out, c.time);
  out.append(", \"shardckpt_version\": ");
  ok &= AppendJsonString(&out, c.shardckpt_version);
  out.append(", \"torch_version\": ");
  ok &= AppendJsonString(&out, c.torch_version);
  out.append(", \"hosts\": ");
  AppendJsonInt(&out, c.hosts);
  out.append(", \"git_commit\": ");
  ok &= AppendJsonString(&out, c.git_commit);
  out.append(", \"user\": {");
  for (auto it = c.user.begin(); it != c.user.end(); ++it) {
    if (it != c.user.begin()) out.append(", ");
    ok &= AppendJsonString(&out, it->first);
    out.append(": ");
    ok &= AppendJsonString(&out, it->second);
  }
  out.append("}}");
  if (!ok) return refuse("the creation metadata");
  if (!m.metrics.empty()) {
    key("metrics");
    out.push_back('{');
    for (auto it = m.metrics.begin(); it != m.metrics.end(); ++it) {
      if (it != m.metrics.begin()) out.append(", ");
      if (!AppendJsonString(&out, it->first)) return refuse("a metric name");
      out.append(": ");
      AppendJsonDouble(&out, it->second);
    }
    out.push_back('}');
  }
  key("files");
  out.push_back('[');
  for (size_t i = 0; i < m.files.size(); ++i) {
    const FileRecord& f = m.files[i];
    out.append(i ? ",\n  {\"name\": " : "\n  {\"name\": ");
    if (!AppendJsonString(&out, f.name)) return refuse("the name of file " + std::to_string(i));
    out.append(", \"size\": ");
    AppendJsonUint(&out, f.size);
    out.append(", \"table_offset\": ");
    AppendJsonUint(&out, f.table_offset);
    out.append(", \"table_sums\": \"");
    out.append(SumsToHex(f.table_page_sums));
    out.push_back('"');
    if (!f.checksums) out.append(", \"checksums\": false");
    out.push_back('}');
  }
  out.append(m.files.empty() ? "]" : "\n ]");
  SC_RETURN_IF_ERROR(append_body(out));
  return out;
}

}  // namespace

Result<std::string> EncodeManifest(const Manifest& m) {
  SC_ASSIGN_OR_RETURN(std::string text, EncodeUnsealed(m, UsesPackedOffsets(m), BodyBytesEstimate(m) + kSealTail,
                                                       [&](std::string& out) { return AppendBody(m, out); }));
  text.append(SealField(Checksum64({text, "\n}"})));
  return text;
}

Result<ManifestBody> EncodeManifestBody(const Manifest& m) {
  ManifestBody body;
  body.text.reserve(BodyBytesEstimate(m));
  SC_RETURN_IF_ERROR(AppendBody(m, body.text));
  body.packed_offsets = UsesPackedOffsets(m);
  return body;
}

std::string ManifestTextPieces::Joined() const {
  std::string text;
  text.reserve(head.size() + body.size() + seal.size());
  text.append(head).append(body).append(seal);
  return text;
}

Result<ManifestTextPieces> EncodeManifestWithBody(const Manifest& head, const ManifestBody& body, size_t head_room) {
  ManifestTextPieces pieces;
  SC_ASSIGN_OR_RETURN(pieces.head,
                      EncodeUnsealed(head, body.packed_offsets, 0, [](std::string&) { return Status::Ok(); }));
  // Spaces after the files list, where JSON allows them: the body then starts at head_room.
  if (pieces.head.size() < head_room) pieces.head.append(head_room - pieces.head.size(), ' ');
  pieces.body = body.text;
  // With a head room, spaces before the seal too: the text ends on a block boundary, so its
  // O_DIRECT write needs no truncation to its size afterwards (a quarter of a millisecond here).
  std::string pad;
  if (head_room != 0) {
    const size_t unpadded = pieces.head.size() + pieces.body.size() + kSealTail;
    pad.assign((kBlockSize - unpadded % kBlockSize) % kBlockSize, ' ');
  }
  pieces.seal = pad + SealField(Checksum64({pieces.head, pieces.body, pad, "\n}"}));
  return pieces;
}

namespace {

// The layouts that reach millions of chunks, checked with one sort: every chunk a box that cuts
// dim 0 only (dim0 sharding, torch.chunk; a replica as the full box) or every chunk a flat range,
// bounds already checked. True when the chunks tile the entry exactly once; false means "not
// shown", and CheckExactCover (general, and naming what overlaps or is missing) decides.
bool TilesDim0(const EntryRecord& e, std::vector<std::pair<int64_t, int64_t>>* spans) {
  if (e.shape.empty()) {
    return e.chunks.size() == 1 &&
           (e.chunks[0].layout.kind == LayoutKind::kWhole || e.chunks[0].layout.kind == LayoutKind::kBox);
  }
  spans->clear();
  const bool flat = !e.chunks.empty() && e.chunks[0].layout.kind == LayoutKind::kFlatRange;
  int64_t extent = e.shape[0];
  if (flat) {
    Result<int64_t> numel = NumElements(e.shape);
    if (!numel.ok()) return false;
    extent = *numel;
  }
  for (const ChunkRecord& c : e.chunks) {
    const Layout& l = c.layout;
    if (flat) {
      if (l.kind != LayoutKind::kFlatRange) return false;
      spans->emplace_back(l.begin, l.end - l.begin);
      continue;
    }
    if (l.kind == LayoutKind::kWhole) {
      spans->emplace_back(0, extent);
      continue;
    }
    if (l.kind != LayoutKind::kBox || l.offsets.size() != e.shape.size()) return false;
    for (size_t d = 1; d < e.shape.size(); ++d) {
      if (l.offsets[d] != 0 || l.sizes[d] != e.shape[d] || e.shape[d] == 0) return false;
    }
    spans->emplace_back(l.offsets[0], l.sizes[0]);
  }
  std::sort(spans->begin(), spans->end());
  int64_t next = 0;
  for (const auto& [begin, size] : *spans) {
    if (size == 0) continue;
    if (begin != next) return false;
    next += size;
  }
  return next == extent;
}

}  // namespace

Status ValidateMetrics(const std::map<std::string, double>& metrics) {
  for (const auto& [name, value] : metrics) {
    if (name.empty() || name.size() > 255) return InvalidArgument("metric names must have 1 to 255 characters");
    // A NUL cut the name short in list, retention's messages and --metric.
    if (name.find('\0') != std::string::npos) return InvalidArgument("a metric's name has a NUL byte in it");
    if (!std::isfinite(value)) {
      return InvalidArgument("metric '" + name + "' is " + std::to_string(value) + ", not a finite number");
    }
  }
  return Status::Ok();
}

Status ValidateUserMetadata(const std::map<std::string, std::string>& user) {
  for (const auto& [key, value] : user) {
    if (key.find('\0') != std::string::npos || value.find('\0') != std::string::npos) {
      return InvalidArgument("user metadata holds a NUL byte (in the key or value of '" + key.substr(0, key.find('\0')) +
                             "'): it is text; bytes belong in a blob");
    }
  }
  return Status::Ok();
}

std::string WithNulsShown(const std::string& name) {
  std::string shown;
  for (char c : name) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  return shown;
}

namespace {

Status InvalidManifest(const std::string& what) { return DataLoss("invalid manifest: " + what); }

// A chunk's or blob's place in its file; `what()` names it, built only for a message.
template <typename What>
Status CheckExtent(const Manifest& m, uint32_t file, uint64_t offset, uint64_t bytes, const What& what) {
  if (file >= m.files.size()) return InvalidManifest(what() + " names file index " + std::to_string(file) + " out of range");
  const FileRecord& f = m.files[file];
  // Files of a DCP folder (no checksums) place records anywhere; ours keep 4096-aligned offsets
  // in format 1.0 and pack small chunks in 1.1.
  if (f.checksums && m.format_minor < kFormatMinorPacked && IsPackedOffset(offset)) {
    return InvalidManifest(what() + " offset " + std::to_string(offset) + " is not 4096-aligned, as format 1.0 requires");
  }
  if (offset > f.table_offset || bytes > f.table_offset - offset) {
    return InvalidManifest(what() + " [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                           ") runs past the data in '" + f.name + "' (" + std::to_string(f.table_offset) + " bytes)");
  }
  return Status::Ok();
}

// Entry `e`'s chunks (its shape and bytes already checked): each inside the shape, as many bytes
// as its layout needs, inside its file, and together covering the entry exactly once.
// Two chunks of one entry on the same bytes of a file (a resealed manifest) each pass alone, and
// a load would silently read one piece's values for the other. Every writer lists an entry's
// chunks in file and offset order, so CheckEntryChunks compares each with the one before as it
// checks it (a second pass over 3 million chunks cost 5% of a decode); another order is sorted
// here.
bool InFileOrderBefore(const ChunkRecord& x, const ChunkRecord& y) {
  return x.file != y.file ? x.file < y.file : x.offset < y.offset;
}

// `a` lies before `b` in file order.
Status CheckChunkBytesApart(const Manifest& m, const EntryRecord& e, uint32_t a, uint32_t b) {
  const ChunkRecord &x = e.chunks[a], &y = e.chunks[b];
  if (x.file != y.file || y.offset >= x.offset + x.bytes) return Status::Ok();
  return InvalidManifest("entry '" + e.name + "' chunks " + std::to_string(std::min(a, b)) + " and " +
                         std::to_string(std::max(a, b)) + " share bytes of file '" + m.files[x.file].name +
                         "' (from offset " + std::to_string(y.offset) + "): each chunk needs bytes of its own");
}

Status CheckSortedChunkBytesApart(const Manifest& m, const EntryRecord& e) {
  std::vector<uint32_t> order;
  for (uint32_t k = 0; k < e.chunks.size(); ++k) {
    if (e.chunks[k].bytes > 0) order.push_back(k);
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return InFileOrderBefore(e.chunks[a], e.chunks[b]); });
  for (size_t k = 1; k < order.size(); ++k) SC_RETURN_IF_ERROR(CheckChunkBytesApart(m, e, order[k - 1], order[k]));
  return Status::Ok();
}

Status CheckEntryChunks(const Manifest& m, const EntryRecord& e, std::vector<std::pair<int64_t, int64_t>>* spans) {
  const int64_t numel = NumElements(e.shape).value();  // valid: the caller checked NumBytes
  uint32_t previous = UINT32_MAX;  // the last chunk with bytes, while they come in file order
  bool in_file_order = true;
  for (size_t i = 0; i < e.chunks.size(); ++i) {
    const ChunkRecord& c = e.chunks[i];
    auto what = [&] { return "entry '" + e.name + "' chunk " + std::to_string(i); };
    Result<int64_t> count = ValidateLayout(c.layout, e.shape, numel);
    if (!count.ok()) return InvalidManifest(what() + ": " + count.status().message());
    if (static_cast<uint64_t>(*count) * DTypeSize(e.dtype) != c.bytes) {
      return InvalidManifest(what() + " holds " + std::to_string(c.bytes) + " bytes but its layout needs " +
                             std::to_string(static_cast<uint64_t>(*count) * DTypeSize(e.dtype)));
    }
    SC_RETURN_IF_ERROR(CheckExtent(m, c.file, c.offset, c.bytes, what));
    if (c.bytes == 0 || !in_file_order) continue;
    if (previous != UINT32_MAX) {
      if (InFileOrderBefore(c, e.chunks[previous])) {
        in_file_order = false;
        continue;
      }
      SC_RETURN_IF_ERROR(CheckChunkBytesApart(m, e, previous, static_cast<uint32_t>(i)));
    }
    previous = static_cast<uint32_t>(i);
  }
  if (!in_file_order) SC_RETURN_IF_ERROR(CheckSortedChunkBytesApart(m, e));
  if (TilesDim0(e, spans)) return Status::Ok();
  std::vector<Layout> layouts;
  std::vector<std::string> owners;
  layouts.reserve(e.chunks.size());
  owners.reserve(e.chunks.size());
  for (size_t i = 0; i < e.chunks.size(); ++i) {
    layouts.push_back(e.chunks[i].layout);
    owners.push_back("chunk " + std::to_string(i));
  }
  Status cover = CheckExactCover(e.name, e.shape, layouts, owners);
  return cover.ok() ? cover : InvalidManifest(cover.message());
}

// An entry's name and size, in ValidateManifest's order; `listed_before()` says whether an
// entry before it has its name (asked once the name is known to be one).
template <typename ListedBefore>
Status CheckEntryNameAndSize(const EntryRecord& e, ListedBefore&& listed_before) {
  if (e.name.empty()) return InvalidManifest("an entry has an empty name");
  // A NUL cut every message, table and C string that named the entry short.
  if (e.name.find('\0') != std::string::npos) {
    return InvalidManifest("entry '" + WithNulsShown(e.name) + "' has a NUL byte in its name");
  }
  if (listed_before()) return InvalidManifest("entry '" + e.name + "' is listed twice");
  Result<int64_t> bytes = NumBytes(e.shape, DTypeSize(e.dtype));
  if (!bytes.ok()) return InvalidManifest("entry '" + e.name + "': " + bytes.status().message());
  return Status::Ok();
}

// Below this many chunks the checks run on the calling thread alone: a thread costs more.
constexpr size_t kChunksWorthAThread = 1 << 16;

// The entries from which a second thread checks the chunks: about half of them by chunk count,
// or entries.size() for none.
size_t SecondHalfStart(const std::vector<EntryRecord>& entries, size_t threads) {
  if (threads < 2) return entries.size();
  size_t total = 0;
  for (const EntryRecord& e : entries) total += e.chunks.size();
  if (total < kChunksWorthAThread) return entries.size();
  size_t seen = 0, i = 0;
  while (i < entries.size() && 2 * seen < total) seen += entries[i++].chunks.size();
  return i;
}

}  // namespace

Status ValidateManifest(const Manifest& m, size_t threads) {
  auto bad = InvalidManifest;
  // No save writes one (save.cc refuses it); its folder name could not hold it either.
  if (m.step < 0) return bad("step " + std::to_string(m.step) + " is negative");
  Status metrics = ValidateMetrics(m.metrics);
  if (!metrics.ok()) return bad(metrics.message());
  std::unordered_set<std::string> file_names;
  for (const FileRecord& f : m.files) {
    if (!IsPlainFileName(f.name)) return bad("file name '" + f.name + "' is not a plain file name");
    if (!file_names.insert(f.name).second) return bad("file '" + f.name + "' is listed twice");
    if (!f.checksums) {
      if (f.table_offset != f.size || !f.table_page_sums.empty()) return bad("file '" + f.name + "' without checksums has a table");
      continue;
    }
    if (f.table_offset % kBlockSize != 0 || f.table_offset > static_cast<uint64_t>(kMaxBytes)) {
      return bad("file '" + f.name + "' has a misaligned or huge table_offset");
    }
    if (f.size != DataFileSize(f.table_offset)) {
      return bad("file '" + f.name + "' size " + std::to_string(f.size) +
                 " does not match its checksum table layout");
    }
    if (f.table_page_sums.size() != TablePages(f.table_offset)) {
      return bad("file '" + f.name + "' has " + std::to_string(f.table_page_sums.size()) +
                 " table checksums, expected " + std::to_string(TablePages(f.table_offset)));
    }
  }
  // The chunks of the entries from `second` on are checked on another thread, side by side with
  // the rest (a tool's decode of 630,000 chunks spent 20 ms here on one core). Which error is
  // returned does not depend on it: the first in entry order, an entry's name and shape before its
  // chunks, as one thread finds it.
  const size_t second = SecondHalfStart(m.entries, threads);
  size_t second_failed_at = m.entries.size();  // where the second thread stopped: an error or a throw
  Status second_failure;
  std::exception_ptr second_threw;  // what it threw there (std::bad_alloc), rethrown here
  auto check_second = [&]() noexcept {
    size_t i = second;
    try {
      std::vector<std::pair<int64_t, int64_t>> spans;
      for (; i < m.entries.size(); ++i) {
        const EntryRecord& e = m.entries[i];
        if (!NumBytes(e.shape, DTypeSize(e.dtype)).ok()) continue;  // the calling thread reports it
        Status checked = CheckEntryChunks(m, e, &spans);
        if (!checked.ok()) {
          second_failed_at = i;
          second_failure = std::move(checked);
          return;
        }
      }
    } catch (...) {
      second_failed_at = i;
      second_threw = std::current_exception();
    }
  };
  std::thread helper;
  // Joined however this function leaves, a throw of this thread's included (a joinable
  // std::thread destroyed ends the process).
  struct JoinOnExit {
    std::thread& thread;
    ~JoinOnExit() {
      if (thread.joinable()) thread.join();
    }
  } join_on_exit{helper};
  if (second < m.entries.size()) {
    try {
      helper = std::thread(check_second);
    } catch (const std::system_error&) {
      check_second();  // no thread to be had (a pids limit): here, before the first half
    }
  }
  // The first error at entry `at`, or the second thread's (an error or a throw) if that came at an
  // earlier entry, as one thread checking in entry order meets them.
  auto first_error = [&](size_t at, Status found) {
    if (helper.joinable()) helper.join();
    if (second_failed_at >= at) return found;
    if (second_threw) std::rethrow_exception(second_threw);
    return second_failure;
  };
  NameIndex entry_names(m.entries.size(), [&](uint32_t i) -> std::string_view { return m.entries[i].name; });
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const EntryRecord& e = m.entries[i];
    Status named = CheckEntryNameAndSize(e, [&] { return !entry_names.TryEmplace(e.name, static_cast<uint32_t>(i)).second; });
    if (!named.ok()) return first_error(i, std::move(named));
    if (i >= second) continue;
    Status checked = CheckEntryChunks(m, e, &spans);
    if (!checked.ok()) return first_error(i, std::move(checked));
  }
  Status chunks = first_error(m.entries.size(), Status::Ok());
  if (!chunks.ok()) return chunks;
  std::unordered_set<std::string> blob_keys;
  for (const BlobRecord& b : m.blobs) {
    auto what = [&] { return "blob '" + b.name + "'"; };
    if (b.name.empty()) return bad("a blob has an empty name");
    if (b.name.find('\0') != std::string::npos) return bad("blob '" + WithNulsShown(b.name) + "' has a NUL byte in its name");
    if (b.scope == BlobScope::kPerRank && b.rank >= m.world_size) {
      return bad(what() + " belongs to rank " + std::to_string(b.rank) + " of a world of " +
                 std::to_string(m.world_size));
    }
    std::string key = b.name + (b.scope == BlobScope::kPerRank ? "@" + std::to_string(b.rank) : "");
    if (!blob_keys.insert(key).second) return bad(what() + " is listed twice");
    SC_RETURN_IF_ERROR(CheckExtent(m, b.file, b.offset, b.bytes, what));
  }
  return Status::Ok();
}

struct ManifestBodyBuilder::Names {
  struct Of {
    const std::vector<std::string>* names;
    std::string_view operator()(uint32_t i) const { return (*names)[i]; }
  };
  explicit Names(size_t expected) : index(expected, Of{&names}) { names.reserve(expected); }
  std::vector<std::string> names;
  NameIndex<Of> index;
};

ManifestBodyBuilder::ManifestBodyBuilder(const Manifest& head, size_t expected_entries, size_t expected_chunks,
                                         std::optional<size_t> continuing_at)
    : head_(head), names_(std::make_unique<Names>(expected_entries)), first_index_(continuing_at.value_or(0)) {
  body_.text.reserve(expected_entries * 80 + expected_chunks * 48);
  if (!continuing_at) AppendEntriesOpening(body_.text);
}

ManifestBodyBuilder::~ManifestBodyBuilder() = default;

Status ManifestBodyBuilder::Add(const EntryRecord& e) {
  const size_t index = entries_;
  SC_RETURN_IF_ERROR(CheckEntryNameAndSize(e, [&] {
    return !names_->index.TryEmplace(e.name, static_cast<uint32_t>(index)).second;
  }));
  names_->names.push_back(e.name);  // after TryEmplace, which reads no name of its own index
  SC_RETURN_IF_ERROR(CheckEntryChunks(head_, e, &spans_));
  if (not_encoded_.ok()) not_encoded_ = AppendEntry(body_.text, e, first_index_ + index);
  for (const ChunkRecord& c : e.chunks) body_.packed_offsets |= IsPackedOffset(c.offset);
  ++entries_;
  return Status::Ok();
}

Result<ManifestBody> ManifestBodyBuilder::Finish(const std::vector<BlobRecord>& blobs, ManifestBodyBuilder* rest) {
  if (rest != nullptr && rest->entries_ > 0) {
    for (const std::string& name : rest->names_->names) {
      const uint32_t index = static_cast<uint32_t>(entries_);
      if (!names_->index.TryEmplace(name, index).second) return InvalidManifest("entry '" + name + "' is listed twice");
      names_->names.push_back(name);
      ++entries_;
    }
    body_.text.append(rest->body_.text);
    body_.packed_offsets |= rest->body_.packed_offsets;
  }
  SC_RETURN_IF_ERROR(not_encoded_);
  if (rest != nullptr) SC_RETURN_IF_ERROR(rest->not_encoded_);
  SC_RETURN_IF_ERROR(AppendEntriesClosingAndBlobs(body_.text, entries_, blobs));
  for (const BlobRecord& b : blobs) body_.packed_offsets |= IsPackedOffset(b.offset);
  return std::move(body_);
}

Status CheckDataFile(const FileRecord& f, const Result<uint64_t>& size) {
  if (!size.ok()) {
    if (size.status().code() == Code::kNotFound) {
      return NotFound("data file '" + f.name + "' is missing: " + size.status().message());
    }
    return size.status();
  }
  if (*size != f.size) {
    return DataLoss("data file '" + f.name + "' is " + std::to_string(*size) + " bytes, the manifest records " +
                    std::to_string(f.size) + (*size < f.size ? " (truncated)" : " (extra bytes)"));
  }
  return Status::Ok();
}

Status CheckDataFiles(const std::vector<FileRecord>& files,
                      const std::function<Result<uint64_t>(const std::string&)>& size_of) {
  for (const FileRecord& f : files) SC_RETURN_IF_ERROR(CheckDataFile(f, size_of(f.name)));
  return Status::Ok();
}

}  // namespace shardckpt
