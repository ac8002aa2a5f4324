"""A one-colour MP4 clip (H.264), written without an encoder: what stands in for a video.

A one-colour picture needs no real coding. The first frame is an IDR picture
whose first macroblock carries its samples as they are (I_PCM) and whose others
are predicted from their neighbours with nothing to add (Intra 16x16, DC); every
later frame skips all its macroblocks (a copy of the one before). Any player or
decoder (ffmpeg, PyAV) shows it; the headers say its size, length and frames.
"""

from __future__ import annotations

import re
import struct

_TIMESCALE = 1000
_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
#: Constrained Baseline: profile 66 with constraint flags 0 and 1.
_PROFILE, _CONSTRAINTS = 66, 0xC0
_MAX_FRAME_NUM_BITS = 4  # frame_num wraps at 16: only one reference frame is kept
#: The largest side it writes (H.264 level 5.1 allows 36864 macroblocks a frame).
MAX_SIDE = 4096


class _Bits:
    """An RBSP being written, as a string of "0"/"1" (small: one bit per macroblock)."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def u(self, width: int, value: int) -> None:
        self._parts.append(format(value, f"0{width}b"))

    def ue(self, value: int) -> None:
        code = format(value + 1, "b")
        self._parts.append("0" * (len(code) - 1) + code)

    def se(self, value: int) -> None:
        self.ue(2 * value - 1 if value > 0 else -2 * value)

    def align(self) -> None:
        self._parts.append("0" * (-self._length() % 8))

    def trailing(self) -> bytes:
        """rbsp_trailing_bits, then the bytes."""
        self.u(1, 1)
        self.align()
        text = "".join(self._parts)
        return int(text, 2).to_bytes(len(text) // 8, "big")

    def _length(self) -> int:
        return sum(len(part) for part in self._parts)


def _nal(header: int, rbsp: bytes) -> bytes:
    """A NAL unit with emulation prevention, length-prefixed as MP4 samples hold them."""
    escaped = re.sub(b"\x00\x00(?=[\x00-\x03])", b"\x00\x00\x03", rbsp)
    return struct.pack(">I", 1 + len(escaped)) + bytes([header]) + escaped


def _ycbcr(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    """BT.601, studio range (what decoders assume when a stream does not say)."""
    r, g, b = rgb
    y = 16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255
    cb = 128 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255
    cr = 128 + (112.0 * r - 93.786 * g - 18.214 * b) / 255
    return round(y), round(cb), round(cr)


def _sps(mbs_wide: int, mbs_high: int, width: int, height: int, level: int) -> bytes:
    bits = _Bits()
    bits.u(8, _PROFILE)
    bits.u(8, _CONSTRAINTS)
    bits.u(8, level)
    bits.ue(0)  # seq_parameter_set_id
    bits.ue(_MAX_FRAME_NUM_BITS - 4)
    bits.ue(2)  # pic_order_cnt_type 2: output order is decoding order
    bits.ue(1)  # max_num_ref_frames
    bits.u(1, 0)  # gaps_in_frame_num_value_allowed_flag
    bits.ue(mbs_wide - 1)
    bits.ue(mbs_high - 1)
    bits.u(1, 1)  # frame_mbs_only_flag
    bits.u(1, 1)  # direct_8x8_inference_flag
    crop_right, crop_bottom = (16 * mbs_wide - width) // 2, (16 * mbs_high - height) // 2
    bits.u(1, 1 if crop_right or crop_bottom else 0)
    if crop_right or crop_bottom:
        for offset in (0, crop_right, 0, crop_bottom):  # in 2-sample units (4:2:0)
            bits.ue(offset)
    bits.u(1, 0)  # vui_parameters_present_flag
    return bits.trailing()


def _pps() -> bytes:
    bits = _Bits()
    bits.ue(0)  # pic_parameter_set_id
    bits.ue(0)  # seq_parameter_set_id
    bits.u(1, 0)  # entropy_coding_mode_flag: CAVLC
    bits.u(1, 0)  # bottom_field_pic_order_in_frame_present_flag
    bits.ue(0)  # num_slice_groups_minus1
    bits.ue(0)  # num_ref_idx_l0_default_active_minus1
    bits.ue(0)  # num_ref_idx_l1_default_active_minus1
    bits.u(1, 0)  # weighted_pred_flag
    bits.u(2, 0)  # weighted_bipred_idc
    for _ in range(3):  # pic_init_qp_minus26, pic_init_qs_minus26, chroma_qp_index_offset
        bits.se(0)
    bits.u(3, 0)  # deblocking control, constrained intra, redundant_pic_cnt: all off
    return bits.trailing()


def _idr(mbs_wide: int, mbs_high: int, sample: tuple[int, int, int]) -> bytes:
    bits = _Bits()
    bits.ue(0)  # first_mb_in_slice
    bits.ue(7)  # slice_type: I, every slice
    bits.ue(0)  # pic_parameter_set_id
    bits.u(_MAX_FRAME_NUM_BITS, 0)  # frame_num
    bits.ue(0)  # idr_pic_id
    bits.u(2, 0)  # no_output_of_prior_pics_flag, long_term_reference_flag
    bits.se(0)  # slice_qp_delta
    y, cb, cr = sample
    bits.ue(25)  # mb_type I_PCM: the one macroblock that carries the colour
    bits.align()
    bits.u(8 * 384, int.from_bytes(bytes([y] * 256 + [cb] * 64 + [cr] * 64), "big"))
    for index in range(1, mbs_wide * mbs_high):
        bits.ue(3)  # I_16x16_2_0_0: DC prediction, no coded coefficients
        bits.ue(0)  # intra_chroma_pred_mode: DC
        bits.se(0)  # mb_qp_delta
        # The luma DC block's coeff_token for no coefficients; its table depends on the
        # neighbours' counts, and an I_PCM neighbour counts 16.
        if index in (1, mbs_wide):
            bits.u(6, 0b000011)
        else:
            bits.u(1, 1)
    return bits.trailing()


def _skipped(frame_num: int, macroblocks: int) -> bytes:
    bits = _Bits()
    bits.ue(0)  # first_mb_in_slice
    bits.ue(5)  # slice_type: P, every slice
    bits.ue(0)  # pic_parameter_set_id
    bits.u(_MAX_FRAME_NUM_BITS, frame_num % (1 << _MAX_FRAME_NUM_BITS))
    bits.u(1, 0)  # num_ref_idx_active_override_flag
    bits.u(1, 0)  # ref_pic_list_modification_flag_l0
    bits.u(1, 0)  # adaptive_ref_pic_marking_mode_flag
    bits.se(0)  # slice_qp_delta
    bits.ue(macroblocks)  # mb_skip_run: the whole picture
    return bits.trailing()


def _box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def solid_mp4(width: int, height: int, rgb: tuple[int, int, int], frames: int, fps: float) -> bytes:
    """An MP4 of `frames` frames of one colour, `width` x `height` (even, up to MAX_SIDE)."""
    if not (2 <= width <= MAX_SIDE and 2 <= height <= MAX_SIDE) or width % 2 or height % 2:
        raise ValueError(f"cannot write a {width}x{height} clip")
    if frames < 1 or not 0 < fps <= 240:
        raise ValueError(f"cannot write {frames} frames at {fps} fps")
    wide, high = (width + 15) // 16, (height + 15) // 16
    level = 40 if wide * high <= 8192 else 51
    sps, pps = _sps(wide, high, width, height, level), _pps()
    sample = _ycbcr(rgb)
    samples = [_nal(0x65, _idr(wide, high, sample))]
    samples += [_nal(0x41, _skipped(n, wide * high)) for n in range(1, frames)]
    # The track counts in frames (a thousandth of a frame: fps to 3 decimals), the movie
    # in milliseconds.
    rate = round(fps * _TIMESCALE)
    duration = round(frames * _TIMESCALE / fps)
    avcc = _box(
        b"avcC",
        bytes([1, _PROFILE, _CONSTRAINTS, level, 0xFF, 0xE1]),
        struct.pack(">H", len(sps) + 1),
        b"\x67" + sps,
        bytes([1]),
        struct.pack(">H", len(pps) + 1),
        b"\x68" + pps,
    )
    avc1 = _box(
        b"avc1",
        bytes(6),
        struct.pack(">H", 1),  # data_reference_index
        bytes(16),
        struct.pack(">HHIIIH", width, height, 0x480000, 0x480000, 0, 1),
        bytes(32),  # compressorname
        struct.pack(">Hh", 0x18, -1),
        avcc,
    )
    sizes = struct.pack(f">{frames}I", *(len(s) for s in samples))
    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isomiso2avc1mp41")

    def moov(chunk_offset: int) -> bytes:
        stbl = _box(
            b"stbl",
            _box(b"stsd", struct.pack(">II", 0, 1), avc1),
            _box(b"stts", struct.pack(">IIII", 0, 1, frames, _TIMESCALE)),
            _box(b"stss", struct.pack(">III", 0, 1, 1)),
            _box(b"stsc", struct.pack(">IIIII", 0, 1, 1, frames, 1)),
            _box(b"stsz", struct.pack(">III", 0, 0, frames), sizes),
            _box(b"stco", struct.pack(">III", 0, 1, chunk_offset)),
        )
        dinf = _box(b"dinf", _box(b"dref", struct.pack(">II", 0, 1), _box(b"url ", b"\0\0\0\1")))
        minf = _box(b"minf", _box(b"vmhd", struct.pack(">IHHHH", 1, 0, 0, 0, 0)), dinf, stbl)
        hdlr = _box(b"hdlr", struct.pack(">II4s12x", 0, 0, b"vide"), b"VideoHandler\0")
        mdhd = _box(b"mdhd", struct.pack(">IIIIIHH", 0, 0, 0, rate, _TIMESCALE * frames, 0x55C4, 0))
        tkhd = _box(
            b"tkhd",
            struct.pack(">IIII4xI8xHHH2x", 3, 0, 0, 1, duration, 0, 0, 0),
            _MATRIX,
            struct.pack(">II", width << 16, height << 16),
        )
        mvhd = _box(
            b"mvhd",
            struct.pack(">IIIII", 0, 0, 0, _TIMESCALE, duration),
            struct.pack(">IH10x", 0x10000, 0x100),
            _MATRIX,
            bytes(24),
            struct.pack(">I", 2),  # next_track_ID
        )
        return _box(b"moov", mvhd, _box(b"trak", tkhd, _box(b"mdia", mdhd, hdlr, minf)))

    # The chunk offset is where the samples start: after ftyp, moov and mdat's header.
    offset = len(ftyp) + len(moov(0)) + 8
    return ftyp + moov(offset) + _box(b"mdat", *samples)
