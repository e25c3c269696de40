// Framing: one Envelope (envelope.capnp) per fabric message.
//
// encode_frame() turns a filled builder into the bytes that go on the wire.
// decode_frame() checks a received frame completely before anyone reads it: size bounds,
// word alignment, and a full traversal of the message (every pointer bounds-checked), so
// later field access on the returned reader never reads out of bounds. The envelope's own
// fields (source, destination, sourceAddress, the body's tag) are also read once, so reading
// them later does not throw. A body field whose pointer is of the wrong kind (a list where a
// struct belongs) still throws kj::Exception when read: handlers read bodies under their
// guard (actors/common/shell.hpp). A frame that fails any check comes back as an Error (kind
// invalid) saying what was wrong.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "messages/envelope.capnp.h"
#include "runtime/base/result.hpp"

namespace tandem::messages {

// An actor's cluster-wide name, "node/role/instance". The node runtime is "node/node/".
struct ActorName {
  std::string node;
  std::string role;
  std::string instance;

  friend bool operator==(const ActorName&, const ActorName&) = default;
  friend auto operator<=>(const ActorName&, const ActorName&) = default;
  std::string to_string() const;                       // "node/role/instance"
  static Result<ActorName> parse(std::string_view text);  // exactly two '/'; node non-empty
};

void set_name(wire::ActorName::Builder builder, const ActorName& name);
ActorName get_name(wire::ActorName::Reader reader);

// Serialized frame bytes, word aligned (capnp flat array).
using FrameBytes = std::vector<capnp::word>;

FrameBytes encode_frame(capnp::MessageBuilder& message);
inline std::span<const std::byte> frame_span(const FrameBytes& frame) {
  return std::as_bytes(std::span<const capnp::word>(frame));
}

// A received, fully validated frame. Owns its bytes; readers borrow from it and must not
// outlive it. Move-only.
class Frame {
 public:
  Frame(FrameBytes words, size_t segment_words);
  Frame(Frame&&) = default;
  Frame& operator=(Frame&&) = default;

  wire::Envelope::Reader envelope();
  size_t size_bytes() const { return words_.size() * sizeof(capnp::word); }

 private:
  FrameBytes words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// Cap'n Proto's traversal limit, per frame: every read of a pointer field counts the words it
// covers (each call of a getter counts again), and a list of zero-sized elements counts one
// word per element. A fixed 512 MiB limit let a 400-byte frame claim a list of 41 million
// empty structs (found by fuzz_frame), each of which the node turned into a message. The limit
// is frame_traversal_factor times the frame's size plus frame_traversal_words_min: room for
// decode_frame's traversal, the bridge and handlers reading it many times over (a getter called
// per element of a 100-element list, say), while an empty-struct list claims at most that
// many elements.
inline constexpr uint64_t frame_traversal_factor = 16;
inline constexpr uint64_t frame_traversal_words_min = 16384;  // 128 KiB worth

// Validates and wraps `bytes`. Copies once into aligned storage.
// Errors (kind invalid): empty, larger than frame_bytes_max, not a multiple of 8 bytes,
// truncated segment table, segments past the end, malformed pointers.
Result<Frame> decode_frame(std::span<const std::byte> bytes, uint64_t frame_bytes_max);

}  // namespace tandem::messages
