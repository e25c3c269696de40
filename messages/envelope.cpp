#include "messages/envelope.hpp"

#include <kj/exception.h>

#include <cstring>

namespace tandem::messages {

std::string ActorName::to_string() const { return node + "/" + role + "/" + instance; }

Result<ActorName> ActorName::parse(std::string_view text) {
  auto first = text.find('/');
  if (first == std::string_view::npos) {
    return make_error(ErrorKind::invalid, "actor name '" + std::string(text) +
                                              "' is not node/role/instance");
  }
  auto second = text.find('/', first + 1);
  if (second == std::string_view::npos || text.find('/', second + 1) != std::string_view::npos) {
    return make_error(ErrorKind::invalid, "actor name '" + std::string(text) +
                                              "' is not node/role/instance");
  }
  ActorName name{std::string(text.substr(0, first)),
                 std::string(text.substr(first + 1, second - first - 1)),
                 std::string(text.substr(second + 1))};
  if (name.node.empty() || name.role.empty()) {
    return make_error(ErrorKind::invalid, "actor name '" + std::string(text) +
                                              "' has an empty node or role");
  }
  return name;
}

void set_name(wire::ActorName::Builder builder, const ActorName& name) {
  builder.setNode(name.node);
  builder.setRole(name.role);
  builder.setInstance(name.instance);
}

ActorName get_name(wire::ActorName::Reader reader) {
  return ActorName{reader.getNode(), reader.getRole(), reader.getInstance()};
}

FrameBytes encode_frame(capnp::MessageBuilder& message) {
  // Cap'n Proto's flat framing, written straight into the frame (one allocation, no copy of
  // a copy): uint32 segment count - 1, the segments' sizes in words, padding to a word,
  // then the segments.
  auto segments = message.getSegmentsForOutput();
  RT_ASSERT(segments.size() > 0);
  size_t table_words = (segments.size() + 2) / 2;
  size_t total = table_words;
  for (const auto& segment : segments) total += segment.size();
  FrameBytes out(total);  // zeroed: the table's padding stays 0
  auto* table = reinterpret_cast<uint32_t*>(out.data());
  table[0] = static_cast<uint32_t>(segments.size() - 1);
  capnp::word* at = out.data() + table_words;
  for (size_t i = 0; i < segments.size(); ++i) {
    table[1 + i] = static_cast<uint32_t>(segments[i].size());
    std::memcpy(at, segments[i].begin(), segments[i].size() * sizeof(capnp::word));
    at += segments[i].size();
  }
  RT_ASSERT(at == out.data() + out.size());
  return out;
}

Frame::Frame(FrameBytes words, size_t segment_words) : words_(std::move(words)) {
  RT_ASSERT(segment_words <= words_.size(), segment_words, words_.size());
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      frame_traversal_words_min + frame_traversal_factor * uint64_t(words_.size());
  options.nestingLimit = 64;
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(
      kj::ArrayPtr<const capnp::word>(words_.data(), words_.size()), options);
}

wire::Envelope::Reader Frame::envelope() { return reader_->getRoot<wire::Envelope>(); }

namespace {

Status check_segment_table(const FrameBytes& words) {
  const auto* table = reinterpret_cast<const uint32_t*>(words.data());
  uint64_t segment_count = uint64_t(table[0]) + 1;
  if (segment_count > 512) {
    return make_error(ErrorKind::invalid, "frame claims " + std::to_string(segment_count) +
                                              " segments (limit 512)");
  }
  uint64_t table_words = (segment_count + 2) / 2;
  if (table_words > words.size()) {
    return make_error(ErrorKind::invalid, "frame truncated inside its segment table");
  }
  uint64_t total_words = table_words;
  for (uint64_t i = 0; i < segment_count; ++i) total_words += table[1 + i];
  if (total_words > words.size()) {
    return make_error(ErrorKind::invalid,
                      "frame truncated: segments need " + std::to_string(total_words * 8) +
                          " bytes, frame has " + std::to_string(words.size() * 8));
  }
  return {};
}

}  // namespace

Result<Frame> decode_frame(std::span<const std::byte> bytes, uint64_t frame_bytes_max) {
  if (bytes.empty()) return make_error(ErrorKind::invalid, "empty frame");
  if (bytes.size() > frame_bytes_max) {
    return make_error(ErrorKind::invalid, "frame of " + std::to_string(bytes.size()) +
                                              " bytes exceeds frame_bytes_max " +
                                              std::to_string(frame_bytes_max));
  }
  if (bytes.size() % sizeof(capnp::word) != 0) {
    return make_error(ErrorKind::invalid, "frame of " + std::to_string(bytes.size()) +
                                              " bytes is not a whole number of 8-byte words");
  }
  FrameBytes words(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.data(), bytes.data(), bytes.size());
  if (Status table = check_segment_table(words); !table.ok()) return table.error();
  size_t size_words = words.size();
  try {
    Frame frame(std::move(words), size_words);
    auto envelope = frame.envelope();
    // Full traversal: every pointer in the message is bounds-checked here, once.
    capnp::AnyStruct::Reader any = envelope;
    (void)any.totalSize();
    // The traversal checks bounds, not kinds: a pointer of the wrong kind (a list where a
    // struct or text belongs) throws when its field is read. The node reads these fields on
    // the fabric thread, outside any handler guard (runtime/node/bridge.cpp), so they are
    // read once here, where a throw is this frame's error.
    (void)get_name(envelope.getSource());
    (void)get_name(envelope.getDestination());
    (void)envelope.getSourceAddress();
    (void)envelope.getBody().which();  // an unknown union tag from a newer peer is reported by the caller
    return frame;
  } catch (const kj::Exception& e) {
    return make_error(ErrorKind::invalid,
                      std::string("malformed frame: ") + e.getDescription().cStr());
  }
}

}  // namespace tandem::messages
