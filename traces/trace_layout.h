#pragma once
// Object and attribute names of the kvtrace HDF5 layout, shared by writer, reader and checker
// (internal to traces/; docs/trace-format.md is the public description).
namespace kvsim::layout {

inline constexpr const char* kFormatAttr = "format";
inline constexpr const char* kVersionAttr = "version";
inline constexpr const char* kSegmentNamesAttr = "segment_names";
inline constexpr const char* kModelGroup = "model";
inline constexpr const char* kCaptureGroup = "capture";
inline constexpr const char* kRequestsGroup = "requests";
inline constexpr const char* kRefGroup = "ref";
inline constexpr const char* kRepeatGroup = "repeat";             // optional: KVzip's reconstruction pass
inline constexpr const char* kChunkStatesGroup = "chunk_states";  // optional: chunks computed alone
inline constexpr const char* kStatusAttr = "status";
inline constexpr const char* kIndexAttr = "index";
inline constexpr const char* kStatusWriting = "writing";
inline constexpr const char* kStatusComplete = "complete";

}  // namespace kvsim::layout
