package parda

import (
	"encoding/binary"
	"hash/crc32"
	"math"
)

const recordMagic = 0x534c535441543031 // "SLSTAT01"

// RecordBytes is the least size Encode takes: a record with a host name
// of 255 bytes.
const RecordBytes = 62 + 255

// Encode lays the record out in a block of size bytes (≥ RecordBytes):
// magic u64 | periodEnd i64 | period i64 | ios u64 | normLatSum f64 |
// window f64 | shares f64 | nameLen u16 | name | crc32 of all before,
// zeros after. A host name is cut to 255 bytes.
func (r Record) Encode(size int) []byte {
	b := make([]byte, max(size, RecordBytes))
	binary.BigEndian.PutUint64(b[0:], recordMagic)
	binary.BigEndian.PutUint64(b[8:], uint64(r.PeriodEndNs))
	binary.BigEndian.PutUint64(b[16:], uint64(r.PeriodNs))
	binary.BigEndian.PutUint64(b[24:], r.IOs)
	binary.BigEndian.PutUint64(b[32:], math.Float64bits(r.NormLatSumNs))
	binary.BigEndian.PutUint64(b[40:], math.Float64bits(r.Window))
	binary.BigEndian.PutUint64(b[48:], math.Float64bits(r.ActiveShares))
	name := r.Host
	if len(name) > 255 {
		name = name[:255]
	}
	binary.BigEndian.PutUint16(b[56:], uint16(len(name)))
	copy(b[58:], name)
	end := 58 + len(name)
	binary.BigEndian.PutUint32(b[end:], crc32.ChecksumIEEE(b[:end]))
	return b
}

// DecodeRecord reads a block Encode wrote; false when b holds no valid
// record (empty, torn or foreign).
func DecodeRecord(b []byte) (Record, bool) {
	if len(b) < 62 || binary.BigEndian.Uint64(b) != recordMagic {
		return Record{}, false
	}
	n := int(binary.BigEndian.Uint16(b[56:]))
	end := 58 + n
	if end+4 > len(b) || crc32.ChecksumIEEE(b[:end]) != binary.BigEndian.Uint32(b[end:]) {
		return Record{}, false
	}
	return Record{
		Host:         string(b[58:end]),
		PeriodEndNs:  int64(binary.BigEndian.Uint64(b[8:])),
		PeriodNs:     int64(binary.BigEndian.Uint64(b[16:])),
		IOs:          binary.BigEndian.Uint64(b[24:]),
		NormLatSumNs: math.Float64frombits(binary.BigEndian.Uint64(b[32:])),
		Window:       math.Float64frombits(binary.BigEndian.Uint64(b[40:])),
		ActiveShares: math.Float64frombits(binary.BigEndian.Uint64(b[48:])),
	}, true
}
