// How often a node restarted because a device was lost, kept across its processes: a device
// broken for good would otherwise restart its node until its supervisor (`tandem up`, systemd)
// gives up, taking the node's healthy instances down with it. With [supervisor] device_lost =
// "restart-node", a loss restarts the node only while fewer than device_lost_restarts_max
// restarts are on record within device_lost_window_ms; past that the node stays up without the
// device (as "stay" does) and says why.
//
// The record is a small file of wall-clock times (ms since the epoch, one per line), in
// $STATE_DIRECTORY (systemd's StateDirectory=) when set, else $XDG_RUNTIME_DIR/tandem, else
// /tmp/tandem-<uid>; named after the cluster, the node and the manifest's path, so two
// clusters on one host never share one. A record that cannot be read counts as empty; one that
// cannot be written leaves every loss restarting the node (the caller logs it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::runtime {

// The pure rule: drops the stamps older than now - window; when fewer than `max` remain,
// appends `now` and returns true (restart), else false (stay up). At most `max` stamps remain.
bool allow_device_lost_restart(std::vector<int64_t>& stamps_ms, int64_t now_ms, int64_t window_ms,
                               uint32_t max);

// The record's path for a node of a cluster loaded from `manifest_file`.
std::string device_lost_record_path(const std::string& cluster, const std::string& node,
                                    const std::string& manifest_file);

// The stamps in a record's text: one decimal number per line; other lines are skipped, and at
// most the last kRecordStampsMax are kept (the file is ours, but a disk is not trusted).
inline constexpr size_t kRecordStampsMax = 1000;
std::vector<int64_t> parse_device_lost_record(std::string_view text);

// parse_device_lost_record of the first kRecordBytesMax bytes of `path`; none when it does not
// exist or cannot be read.
inline constexpr size_t kRecordBytesMax = 64 * 1024;
std::vector<int64_t> read_device_lost_record(const std::string& path);

// Writes `stamps` to `path` (its directory created; a temporary file renamed into place).
Status write_device_lost_record(const std::string& path, const std::vector<int64_t>& stamps_ms);

}  // namespace tandem::runtime
