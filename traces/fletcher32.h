#pragma once
// HDF5's Fletcher32 chunk checksum, bit for bit, computed a 360-word block at a time instead of a
// word at a time (several times faster than the library's loop). The trace writer and reader move
// K/V/Q chunks past HDF5's filter pipeline (direct chunk writes and reads) with this checksum, so
// the files stay standard: h5py and any HDF5 reader verify them. Why: docs/trace-format.md.
#include <cstddef>
#include <cstdint>

namespace kvsim::h5 {

constexpr std::size_t kFletcherBytes = 4;  // stored after each chunk, little-endian

// The checksum HDF5 stores after each chunk (H5_checksum_fletcher32's value).
std::uint32_t fletcher32(const std::uint8_t* data, std::size_t len);

// Whether a stored chunk (its data, then the 4 checksum bytes) is intact: its checksum, or the
// byte-swapped value HDF5 before 1.6.3 wrote, as the library accepts.
bool fletcher32_intact(const std::uint8_t* chunk, std::size_t stored_bytes);

// Appends the checksum of data[0, len) at data + len (room for kFletcherBytes more).
void append_fletcher32(std::uint8_t* data, std::size_t len);

}  // namespace kvsim::h5
