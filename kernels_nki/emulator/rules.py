"""Every rule the NKI emulator enforces, as data: one row per rule, each with the AWS document behind it.

A row names what it checks, the targets it applies to (`trn1` = NeuronCore-v2, the default; `trn2` =
NeuronCore-v3) and its source: a path in aws-neuron/aws-neuron-sdk and the section or API it comes from.
`reading` says how an ambiguous or silent document was read. Every check in the emulator goes through
`violate(rule_id, detail, target)`, which raises `NkiRuleError` naming the kernel's file:line, the rule id
and its source; a rule whose targets exclude the running target is skipped. Rows with `kind="ast"` are
checked on the kernel source before it runs (`kernels_nki.emulator.ast_pass`).

Readings (`READINGS`): where AWS's documents disagree, `reading="any"` (the emulator's default) accepts a form
valid under any of them, so AWS's own kernels run; `reading="strict"` also checks the rows with `strict=True`,
each refusing a form that is valid under only one of the readings (both sources quoted in the row). A kernel
module loaded with `load_kernel_module(name, reading="strict")` runs under the strict reading unless a call
says otherwise (the project's kernels are: `kernels_nki.registry.load_emulated`).

The emulator follows NKI 0.6.0 (`NKI_VERSION`, Neuron SDK 2.32; the supported SDKs 2.30-2.32 ship NKI 0.4-0.6);
`CHANGES` lists the differences from NKI 0.3 that matter, each with its release-notes section
(aws-neuron-sdk release-notes/components/nki.rst) and where the emulator follows it.

List the table: `python -m kernels_nki.emulator [--target trn2] [--markdown] [--changes]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap

from kernels_nki.emulator.errors import NkiRuleError, kernel_location

TARGETS = ("trn1", "trn2")
READINGS = ("any", "strict")
V2 = ("trn1",)
ALL = TARGETS

ISA = "nki/api/nki/isa/__init__.py"
LANG = "nki/api/nki/language/__init__.py"
SHARED = "nki/api/nki.api.shared.rst"
ARCH1 = "nki/guides/architecture/trainium_inferentia2_arch.rst"
ARCH2 = "nki/guides/architecture/trainium2_arch.rst"
NOTES = "release-notes/components/nki.rst"
DGE = "nki/deep-dives/nki-dge.rst"
GUIDE = "nki/get-started/nki-language-guide.rst"


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """What differs between the emulated NeuronCores (sources in the rows that use these numbers)."""

    name: str
    nc_version: str  # nki.isa.get_nc_version()
    sbuf_partition_bytes: int
    psum_banks: int = 8
    psum_bank_bytes: int = 2048
    max_lnc: int = 1


TARGET_SPECS = {
    "trn1": TargetSpec("trn1", "gen2", 192 * 1024),
    "trn2": TargetSpec("trn2", "gen3", 224 * 1024, max_lnc=2),
}


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    checks: str
    targets: tuple[str, ...]
    source: str
    kind: str = "runtime"  # "runtime": checked as the kernel runs; "ast": on its source before it runs
    reading: str = ""
    strict: bool = False  # checked under reading="strict" only (valid under one documented reading, not another)


R = Rule
RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------- kernel source (AST pass)
    R("ast.is_operator", "`is` / `is not` only against None in kernel code; otherwise use == / !=", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes; nki/migration/index.rst ('Replace is / is not with == / !=')", "ast",
      "Kernel code is every @nki.jit function of the file and every function of the file it calls. The notes "
      "name no exception, but AWS's nki-library (the production kernels the compiler ships as bundled nkilib, "
      "aws-neuron/nki-library README) compares with None by `is` / `is not` 318 times and with nothing else: "
      "read as the compiler accepting identity against None, the singleton the guide lists as an NKI value "
      "(nki-language-guide.rst, NKI Values), so only other `is` comparisons are rejected."),
    R("ast.kwonly_args", "no keyword-only separator `*` in a kernel signature", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes", "ast"),
    R("ast.foreign_module", "kernel code calls only the nki namespaces (nki, nki.language, nki.isa, nki.typing) "
      "and Python's math, not other Python modules (struct, numpy, ...)", ALL,
      f"{GUIDE} introduction ('not all Python constructs and libraries are supported'), Compilation model "
      "('All Python expressions on compile-time values ... are evaluated at specialization time') and NKI Values",
      "ast",
      "The guide lists the values a kernel may hold (None, bool, int32, float32, str, tensors, tuples, lists, "
      "str-keyed dicts, NKIObject classes) and warns that libraries are not supported; a module call returns "
      "none of these, so kernel code may not reference a module imported from outside nki. math is the "
      "exception: its functions map compile-time numbers to numbers, and AWS's nki-library kernel code calls "
      "math.ceil / floor / gcd / sqrt / pi on shapes (core/max/cascaded_max.py, attention/attention_tkg.py). "
      "In a helper file (no @nki.jit) kernel code is the functions that use an nki name and those they call."),
    R("ast.neuronxcc_namespace", "kernel code uses nki, not the removed neuronxcc.nki namespace", ALL,
      f"{NOTES} NKI 0.4.0 Breaking Changes ('Usage of the deprecated neuronxcc.nki.* namespace inside NKI kernels "
      "now raises a compilation error')", "ast",
      "'Inside NKI kernels': a neuronxcc name used by kernel code is rejected at its use; a module-level import "
      "whose names only annotate parameters (AWS's nki-library router_topk: `nt.mutable_tensor`) is not kernel "
      "code."),
    # ---------------------------------------------------------------- kernel interface
    R("kernel.output_shared_hbm", "kernel outputs are HBM tensors allocated with buffer=nl.shared_hbm (or kernel "
      "inputs written in place)", ALL, f"{NOTES} NKI 0.3.0 Breaking Changes ('Output tensors must use "
      "buffer=nl.shared_hbm')", "runtime",
      "The note is about the tensors a kernel allocates for its outputs; a kernel may return an input it wrote "
      "in place (AWS's nki-library core/embeddings/rope_hf.py returns q_out / k_out, its test aliases them to "
      "inputs)."),
    R("kernel.list_args", "kernel arguments are not Python lists, nor hold one (use tuples); no parameter "
      "defaults to a list", ALL, f"{NOTES} NKI 0.3.0 Breaking Changes ('list kernel arguments are not supported')",
      "runtime", "A list default is an argument the caller did not pass: caught by the AST pass at the parameter; "
      "passed values (nested in tuples too) at the @nki.jit line."),
    R("kernel.dict_keys", "dictionaries built by kernel code have string keys only", ALL,
      f"{GUIDE} NKI Values ('Dictionaries with string-value keys'); nki/migration/index.rst ('Dictionaries "
      "support only string keys')", "runtime",
      "A literal non-string key is caught by the AST pass; any other key where kernel code sets it (the "
      "emulator builds kernel code's dictionaries as language.NkiDict). Module-level dictionaries are Python, "
      "not kernel code (AWS's nki-library keys one by dtype)."),
    R("kernel.lnc", "a kernel launched on more logical NeuronCores than the target has (trn1: 1, trn2: 2)", ALL,
      f"{NOTES} NKI 0.4.0 (LNC2 is trn2 or later); nki/get-started/about/lnc.rst"),
    R("buffer.object", "buffers are nl buffer objects (nl.sbuf, nl.psum, nl.shared_hbm, ...), not strings", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes"),
    R("tensor.zero_size", "tensors (kernel inputs and allocations) have no zero-size dimension", ALL,
      f"{LANG} NkiTensor / ndarray; {ARCH1} Accessing SBUF/PSUM tensors", "runtime",
      "No AWS document defines a zero-size tensor or a zero-length access pattern; the emulator rejects one, "
      "so a caller with nothing to compute skips the kernel."),
    # ---------------------------------------------------------------- memory and access patterns
    R("partition.max", "an SBUF/PSUM tile spans at most 128 partitions", ALL,
      f"{ARCH1} Memory (128 partitions); {NOTES} NKI 0.6.0 Improvements (128-partition verification)"),
    R("partition.start", "an engine operand of n partitions starts at partition 0 (n > 64), 0/64 (32 < n <= 64) "
      "or 0/32/64/96 (n <= 32)", ALL, f"{ARCH1} Data Movement, Accessing SBUF/PSUM tensors using compute engines"),
    R("partition.no_stride", "an SBUF/PSUM view has no stride on the partition axis", ALL,
      f"{ARCH1} Accessing SBUF/PSUM tensors ('hardware does not allow P dimension striding')"),
    R("free.access_pattern", "an SBUF/PSUM view has at most 4 free axes, each of at most 65535 elements", ALL,
      f"{ARCH1} Accessing SBUF/PSUM tensors (four-dimensional access pattern, uint16 sizes)"),
    R("sbuf.capacity", "a directly allocated tile (nl.ndarray(..., address=(partition, byte offset))) lies inside "
      "the target's SBUF partition (trn1 192 KiB, trn2 224 KiB) or PSUM (8 x 2 KiB, starting at a bank)", ALL,
      f"{ARCH1} NeuronCore-v2 memory (24 MiB = 128 x 192 KiB); {ARCH2} NeuronCore-v3 (28 MiB = 128 x 224 KiB); "
      "nki/migration/index.rst Improved allocation API (address; PSUM 'must start at the beginning of each bank "
      "- the compiler will throw an error otherwise'); nki/get-started/about/memory-hierarchy-overview.rst "
      "(spills)", "runtime",
      "Automatically allocated SBUF tiles are never refused for capacity: 'If the total size of the live data "
      "being used by a NKI kernel overflows the capacity of any on-chip memory, the Neuron compiler will insert "
      "the necessary spills or refills between that memory and the next-tier memory' (memory-hierarchy-overview."
      "rst); the emulator counts the overflow (Counters.sbuf_spill_peak_bytes) and does not charge the spill "
      "traffic. Direct allocation bypasses the allocator (nki/index.rst: 'direct allocation ... bypass certain "
      "compiler passes'), so there is nothing to spill: an address outside the memory is an error. Directly "
      "allocated tiles are not counted in the live total (their placement and reuse are the kernel's)."),
    R("psum.capacity", "live PSUM fits 8 banks of 2 KiB per partition (16 KiB)", ALL,
      f"{ARCH1} Near-memory accumulation in PSUM; {ARCH2} ('PSUM capacity remains the same at 2MiB')"),
    R("engine.hbm", "compute engines read and write only SBUF/PSUM; HBM is reached by DMA", ALL,
      f"{ARCH1} Data Movement (HBM <-> SBUF by DMA engines)"),
    R("gpsimd.psum", "GpSimd instructions (iota, affine_select, engine=gpsimd) do not touch PSUM", ALL,
      f"{ISA} tensor_copy, iota, affine_select ('GpSimd Engine cannot access PSUM')"),
    R("view.reshape", "reshape keeps the element count and, on chip, the partition dim; the layout allows a view", ALL,
      f"{LANG} NkiTensor.reshape"),
    R("view.ap", ".ap(): on chip the partition stride equals the storage's free size; the pattern stays in bounds",
      ALL, f"{GUIDE} Access patterns (.ap()); {LANG} NkiTensor.ap"),
    # ---------------------------------------------------------------- DMA
    R("dma.buffers", "DMA (dma_copy, nl.load, nl.store) moves between HBM and SBUF; it does not read or write PSUM",
      ALL, f"{ISA} dma_copy (Memory types); {NOTES} NKI 0.3.0 Breaking Changes (no PSUM reads)"),
    R("dma.elements", "dma_copy src and dst hold the same number of elements", ALL, f"{ISA} dma_copy (Tile size)"),
    R("dma.removed_args", "dma_copy has no dst_rmw_op / unique_indices (use dma_compute)", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes; nki/migration/index.rst"),
    R("dma.hwdge", "dge_mode=hwdge needs NeuronCore-v3 or newer", V2, f"{DGE} Mode Selection Summary; {ISA} dma_copy"),
    R("dma.hwdge_dtype", "dma_copy with dge_mode=hwdge does not cast (src and dst dtypes match)", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes"),
    R("dma.indirect", "indirect DMA (.ap(vector_offset=...)) needs NeuronCore-v3 or newer", V2,
      f"{DGE} Mode Selection Summary (swdge: 'indirect: v3+')"),
    R("dma.indirect_dge", "indirect DMA runs with dge_mode unknown or swdge", ALL,
      f"{DGE} How .ap() Affects DGE Mode"),
    R("dma_transpose.args", "dma_transpose: axes (1, 0), (2, 1, 0) or (3, 1, 2, 0) of the source's rank; dst in "
      "SBUF, of the source's dtype and exactly the transposed shape", ALL,
      f"{ISA} dma_transpose; {NOTES} NKI 0.4.0 Breaking Changes (dst.shape matches the transposed src exactly, "
      "including rank)", "runtime",
      "The direct transpose has no NeuronCore-version note (hwdge and indirect sources do: rules dma.hwdge, "
      "dma.indirect) and AWS's nki-library attention_cte, whose tests include trn1, issues it, so it is emulated "
      "on both targets; the hardware DMA transpose is a Trainium2 feature (trainium2_arch.rst, DMA Transpose), so "
      "the emulator counts it as a DMA of one-element buffers (the strided copy any DMA engine can do), in the "
      "report's < 256 B share, where the cost model's peak-rate estimate is optimistic."),
    R("dma_compute.args", "dma_compute: unique_indices=True, scales all 1.0, sources in SBUF, reduce_op nl.add", ALL,
      f"{ISA} dma_compute"),
    # ---------------------------------------------------------------- TensorE
    R("matmul.buffers", "nc_matmul reads stationary and moving from SBUF and writes dst in PSUM", ALL,
      f"{ISA} nc_matmul (Memory types)"),
    R("matmul.contraction", "nc_matmul contracts over the partition axis: stationary and moving have equal "
      "partition sizes, dst is [stationary free, moving free]", ALL, f"{ISA} nc_matmul (Layout)"),
    R("matmul.stationary_fmax", "nc_matmul stationary free size <= 128", ALL, f"{ISA} nc_matmul (Tile size)"),
    R("matmul.moving_fmax", "nc_matmul moving free size <= 512 (one PSUM bank of fp32)", ALL,
      f"{ISA} nc_matmul (Tile size: NeuronCore-v2 and -v3)"),
    R("matmul.dst_fp32", "nc_matmul dst is float32 on NeuronCore-v2 and -v3", ALL, f"{ISA} nc_matmul (Data types)"),
    R("matmul.dtypes", "nc_matmul inputs are float; if one is float32 the other is too", ALL,
      f"{ISA} nc_matmul (Data types)"),
    R("matmul.perf_mode", "nc_matmul perf_mode is off on NeuronCore-v2", V2, f"{ISA} nc_matmul (performance mode)"),
    R("matmul.accumulate", "accumulate=True needs PSUM written by a matmul before (not memset/copy)", ALL,
      f"{ISA} nc_matmul (accumulate; NeuronCore-v2/-v3 note)"),
    R("matmul.tiling", "tile_position / tile_size: row and column tiles of 32/64/128 (32 on v3+), start a multiple of the size",
      ALL, f"{ISA} nc_matmul (column tiling mode)"),
    R("matmul.tiling_dst", "nc_matmul dst starts at the partition of its column tile (0 without tiling mode): "
      "PE column c writes PSUM partition c", ALL,
      "aws-neuron/nki-library src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_down_projection.py and "
      "core/router_topk/router_topk.py (column-tiled nc_matmul, dst sliced at the tile's start column)"),
    R("transpose.dtype", "nc_transpose dst dtype equals data dtype (a TensorE transpose may write float32)", ALL,
      f"{ISA} nc_transpose (Data types; 'equivalent to calling nisa.nc_matmul directly with is_transpose=True'), "
      "nc_matmul (Data types: dst float32 on NeuronCore-v2 and -v3)", "runtime",
      "The two documents disagree for a TensorE transpose of a non-fp32 tile on NeuronCore-v2/-v3 (same dtype "
      "vs the matmul's fp32 PSUM dst); both are accepted, as AWS's nki-library qkv_cte writes a bf16 transpose "
      "into an fp32 PSUM tile; the strict reading refuses both on NeuronCore-v2 (rule strict.transpose_dtype). "
      "A VectorE transpose keeps the dtype."),
    R("transpose.engine", "TensorE nc_transpose: SBUF -> PSUM, up to 128 x 128; VectorE: up to 32 x 32", ALL,
      f"{ISA} nc_transpose (Memory types, Tile size)"),
    # ---------------------------------------------------------------- ScalarE / VectorE
    R("tensor_copy.scalar", "tensor_copy does not run on the Scalar Engine on NeuronCore-v2 "
      "(use activation(op=nl.copy))", V2, f"{ISA} tensor_copy"),
    R("activation.op_table", "activation op is one of the Scalar Engine functions", ALL,
      f"{SHARED} Supported Activation Functions"),
    R("activation.bias_vector", "activation bias is an [N, 1] tile, not a Python number, on NeuronCore-v2", V2,
      f"{ISA} activation (Layout)"),
    R("activation.reciprocal_bias", "activation(op=nl.reciprocal) takes no bias on NeuronCore-v2", V2,
      f"{SHARED} NKI Engine Selection"),
    R("activation.reduce_add", "activation reduce_op is nl.add on NeuronCore-v2", V2,
      f"{ISA} activation, activation_reduce"),
    R("activation.operands", "activation scale is a number or a float32 [N, 1] tile; bias an [N, 1] tile "
      "(not tfloat32)", ALL, f"{ISA} activation (Data types, Layout)"),
    R("activation.input_range", "Scalar Engine function inputs lie in the documented valid range "
      "(log [2^-64, 2^64], sqrt [2^-116, 2^118], rsqrt [2^-87, 2^97], reciprocal +-[2^-42, 2^42], "
      "sin [-pi, pi], arctan [-pi/2, pi/2])", ALL, f"{SHARED} Supported Activation Functions (Valid Input Range)",
      "runtime",
      "The doc says out-of-range inputs give invalid results; the emulator refuses them (an error at the "
      "kernel line, in compute mode, ignoring NaN inputs) rather than inventing a value."),
    R("alu.op_table", "ALU ops (tensor_tensor, tensor_scalar, scalar_tensor_tensor, scans, nl.* binary) are in the "
      "operator table; nl.divide is not", ALL,
      f"{SHARED} Supported Math Operators; {NOTES} NKI 0.3.0 Known Issues (nl.divide not supported)"),
    R("alu.no_broadcast", "binary operands have the same partition size and elements per partition "
      "(nl.* binary ops: the same shape; no broadcasting)", ALL,
      f"{ISA} tensor_tensor; {NOTES} NKI 0.3.0 Known Issues (no broadcasting)"),
    R("tensor_scalar.operands", "tensor_scalar operands are numbers or float32 [N, 1] tiles", ALL,
      f"{ISA} tensor_scalar ('operand0 and operand1 (if used) must be float32')", "runtime",
      "A Python number is a compile-time constant the compiler encodes as float32; tiles must be float32."),
    R("tensor_scalar.gpsimd", "tensor_scalar runs on GpSimd only for rsqrt", ALL,
      f"{ISA} tensor_scalar (engine: 'nki.isa.engine.gpsimd (only allowed for rsqrt)')", "runtime",
      "Read as: one of the instruction's operators is nl.rsqrt."),
    R("tensor_tensor.psum", "tensor_tensor data1 and data2 are not both in PSUM", ALL, f"{ISA} tensor_tensor"),
    R("stt.psum", "scalar_tensor_tensor data and operand1 are not both in PSUM", ALL, f"{ISA} scalar_tensor_tensor"),
    R("scan.psum", "tensor_tensor_scan data0 and data1 are not both in PSUM", ALL, f"{ISA} tensor_tensor_scan"),
    R("reduce.axes", "tensor_reduce reduces the last contiguous free axes (never the partition axis)", ALL,
      f"{ISA} tensor_reduce"),
    R("reduce.op", "tensor_reduce op is a legal reduction op (add, subtract, multiply, maximum, minimum, ...)", ALL,
      f"{SHARED} Supported Math Operators (Legal Reduction op)"),
    R("memset.value", "memset value matches dst's dtype (no float value into an integer tile)", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes"),
    R("gather.args", "nc_n_gather: data, indices, dst in SBUF; indices uint32; dst in data's dtype with as many "
      "elements per partition as indices; equal partitions; indices within data's flattened free size", ALL,
      f"{ISA} nc_n_gather", "runtime",
      "The document carries no NeuronCore-version note (range_select, by contrast, says 'NeuronCore-v3 and "
      "newer'); it replaced nl.gather_flattened (release-notes/components/nki.rst), so it is read as "
      "available on NeuronCore-v2."),
    R("affine_select.args", "affine_select: dst and on_true_tile in SBUF, on_false_value a number, the pattern "
      "matches dst's free shape (0.3 order: dst, pattern, channel_multiplier, on_true_tile, on_false_value, "
      "cmp_op, offset)", ALL, f"{ISA} affine_select; {NOTES} NKI 0.3.0 Breaking Changes"),
    # ---------------------------------------------------------------- the strict reading (reading="strict")
    R("strict.transpose_dtype", "a TensorE nc_transpose transposes float32 data only on NeuronCore-v2 (transpose "
      "other dtypes by nc_matmul against an identity into float32 PSUM)", V2,
      f"{ISA} nc_transpose (Data types: 'The output dst tile must have the same data type as that of data'; "
      "'This is equivalent to calling nisa.nc_matmul directly with is_transpose=True'); "
      f"{ISA} nc_matmul (Transpose mode: 'On NeuronCore-v2, Tensor Engine does not support transpose mode "
      "natively'; Data types: 'The dst tile must be a float32 tile in NeuronCore-v2 and NeuronCore-v3'); "
      f"{ARCH1} Tensor Engine ('the output data of a TensorE calculation is always in FP32'); {ARCH2} Built-in "
      "Transpose Support ('FP16/BF16 PSUM output for FP16/BF16 transpose' is a benefit of the transpose mode "
      "'Starting with NeuronCore-v3')", "runtime",
      "nc_transpose's own text gives dst data's dtype; on NeuronCore-v2, where TensorE has no transpose mode and "
      "the transpose is a plain matmul against the identity, the matmul and architecture pages give a float32 "
      "PSUM dst, and the bf16 PSUM output is documented only as new in NeuronCore-v3. bf16 data into bf16 PSUM "
      "is valid under the first reading only, into float32 PSUM under the second only (rule transpose.dtype "
      "accepts both: AWS's nki-library qkv_cte writes a bf16 transpose into float32 PSUM). float32 data into "
      "float32 PSUM, and nc_matmul(stationary=data, moving=identity) into float32 PSUM, are valid under both.",
      strict=True),
    R("strict.accumulate_inference", "an nc_matmul (or TensorE transpose) leaving accumulate to inference "
      "(accumulate=None) writes either a partition's PSUM bank no matmul wrote yet or only locations a matmul "
      "already wrote (otherwise pass accumulate=False / True, or use another bank)", ALL,
      f"{ARCH1} Near-memory accumulation in PSUM ('the first write to a PSUM bank overwrites, and subsequent writes "
      "accumulate'; 'with 8 PSUM banks per partition, TensorE can have up to eight outstanding matmul "
      "accumulation groups'), against the same section's note and "
      f"{ISA} nc_matmul (Accumulation mode: 'first write overwrites, subsequent writes accumulate' per 'PSUM "
      "location'; accumulate: 'auto-detect based on whether this PSUM location was previously written'); "
      f"{NOTES} NKI 0.6.0 Bug Fixes ('nc_matmul warns on PSUM accumulation patterns that produce incorrect "
      "results on hardware')", "runtime",
      "The architecture guide infers overwrite / accumulate per bank (the bank of one partition: '8 PSUM banks "
      "per partition'), the ISA page and the guide's own note per location. They agree while each partition's "
      "bank holds one accumulation group; a second group opened by inference in a bank another group has written "
      "(its first write overwrites per location, accumulates per bank), or a write covering locations the group "
      "has and has not written, is valid under one reading only. An explicit accumulate flag is the same under "
      "both. A TensorE nc_transpose is such a matmul ('equivalent to calling nisa.nc_matmul directly with "
      "is_transpose=True', its accumulate 'Not exposed'), so transposes sharing a bank go through nc_matmul with "
      "explicit flags (AWS's nki-library attention_bwd puts several nc_transposes in one PSUM tile: refused "
      "strict, run under 'any'). A bank is fresh from its tile's allocation; the emulator computes per location "
      "(reading 'any').",
      strict=True),
    R("strict.row_tile_partitions", "a row-tiled nc_matmul (tile_position / tile_size) reads stationary and "
      "moving on its row tile's partitions (start_row .. start_row + row_size)", ALL,
      f"{ISA} nc_matmul (Tiling mode: 'Row tiling mode slices the 128 PE rows into 2x 64 row tiles'; 'setting "
      "tile_position to (64, 0) and tile_size to (64, 128) means using the bottom half of the systolic array'); "
      f"{ARCH1} Tensor Engine (Tile Size: the partition size 'must never exceed 128, due to the number of PE rows "
      "and also the number of SBUF partitions'); release-notes/components/nki-lib.rst Neuron 2.32.0 Bug Fixes "
      "(Attention CTE: 'disabled row-tiled attention with manual allocation')", "runtime",
      "No AWS document says which SBUF partitions feed a row tile. The contraction runs along the partitions, "
      "one PE row per partition (the Tile Size limit counts both); read so, the bottom half of the array "
      "multiplies partitions 64-127, and operands on partitions 0-63 give it nothing to multiply. Read as the "
      "compiler routing any partitions to any row tile, they are valid. AWS's nki-library tiles columns only "
      "(tile_position (0, c): core/mlp/mlp_tkg, core/qkv/qkv_tkg.py, core/router_topk/router_topk.py) and its "
      "2.32 notes disabled its row-tiled attention; the strict reading keeps operands on the tile's partitions.",
      strict=True),
    R("strict.loop_alias", "loops iterate range(), not the deprecated nl.affine_range / nl.sequential_range / "
      "nl.static_range", ALL,
      f"{LANG} affine_range, sequential_range, static_range ('This function is an alias for Python's range() "
      "function. Prefer using range() directly instead.'; 'This API is deprecated and will be removed in future "
      "releases.'); nki/get-started/about/index.rst ('nl.static_range, nl.sequential_range, and nl.affine_range "
      "are deprecated. They behave as aliases of range()')", "runtime",
      "NKI 0.6 runs the aliases as range(), so both readings of NKI 0.6 accept them; the documents announce their "
      "removal, and a kernel using them is valid under the current release only. The strict reading refuses "
      "them (an error, not a warning, so that kernels held to it cannot take them up again); the emulator runs "
      "them as range() under reading 'any'.",
      strict=True),
    R("strict.is_none", "kernel code compares with None by == / != (not `is None` / `is not None`)", ALL,
      f"{NOTES} NKI 0.3.0 Breaking Changes; nki/migration/index.rst ('The NKI 0.3.0 compiler does not support "
      "Python's is / is not operators'), against AWS's nki-library (core/attention/attention_cte.py: 'if k_prior "
      "is not None:')", "ast",
      "The migration notes refuse `is` and `is not` without exception; AWS's nki-library, the kernels the compiler "
      "ships, compares with None by `is` / `is not` throughout (rule ast.is_operator accepts that reading). "
      "`== None` / `!= None` are valid under both; the strict reading refuses the identity form against None.",
      strict=True),
)

# The NKI the emulator follows: 0.6.0, the newest of the supported SDKs (Neuron 2.30-2.32 ship NKI 0.4.0-0.6.0).
NKI_VERSION = "0.6.0"


@dataclasses.dataclass(frozen=True)
class Change:
    """A difference from NKI 0.3 that matters to the emulator: the release that made it, what it is (its
    release-notes section), and where the emulator follows it (a rule id, an API, or why it is not emulated)."""

    version: str
    what: str
    emulator: str


C = Change
CHANGES: tuple[Change, ...] = (
    C("0.4.0", "float8_e4m3fn (OCP, no inf, max 448) is a dtype distinct from float8_e4m3 (legacy, max 240) "
      "(New Features, nc_matmul float8_e4m3fn)", "nl.float8_e4m3 / nl.float8_e4m3fn (ml_dtypes)"),
    C("0.4.0", "tile_size bytes-aware constants sbuf_size_bytes, sbuf_fmax(_bytes), psum_bank_fmax(_bytes); "
      "total_available_sbuf_size deprecated (New Features; Deprecated)", "nl.tile_size, per target"),
    C("0.4.0", "neuronxcc.nki.* inside NKI kernels is a compilation error (Breaking Changes)",
      "rule ast.neuronxcc_namespace"),
    C("0.4.0", "dma_transpose dst.shape matches the transposed src exactly, rank included (Breaking Changes)",
      "rule dma_transpose.args"),
    C("0.4.0", "dma_compute takes oob_mode (New Features)", "isa.dma_compute(oob_mode=)"),
    C("0.4.0", "frozen NKIObject dataclasses construct (Bug Fixes)", "nl.NKIObject"),
    C("0.4.0", "nc_transpose honours engine= (Bug Fixes)", "isa.nc_transpose(engine=)"),
    C("0.4.0", "tensor_copy_dynamic_src / _dst removed (Deprecated and Removed APIs)", "absent from nki.isa"),
    C("0.4.0", "JAX scalar dtypes accepted as kernel arguments (New Features)",
      "not emulated: a kernel argument dtype is a NumPy / ml_dtypes dtype"),
    C("0.5.0", "float8_e8m0fnu, the MX scale dtype (New Features)", "nl.float8_e8m0fnu"),
    C("0.5.0", "NkiTensor.reshape asserts the element count (Improvements)", "rule view.reshape"),
    C("0.5.0", "tile_size.psum_num_banks (New Features)", "nl.tile_size.psum_num_banks"),
    C("0.5.0", "nl.rsqrt runs on GpSimd; PSUM inputs are no longer supported (Improvements)",
      "nl.rsqrt (a GpSimd tensor_scalar; rule gpsimd.psum)"),
    C("0.5.0", "NkiTensor view methods slice/select/permute/broadcast/... (New Features)",
      "not emulated: no nki-library core kernel calls them; indexing, reshape and .ap() are"),
    C("0.5.0", "tensor indirection (.indirect()) on compute APIs, NeuronCore-v4+ (New Features)",
      "not emulated: neither target has it"),
    C("0.6.0", "nl.copy is a VectorE tensor_copy (New Features)", "nl.copy"),
    C("0.6.0", "compute-engine operands over 128 partitions are a verification error (Improvements)",
      "rule partition.max"),
    C("0.6.0", "affine_select / range_select take a Python float on_false_value (Bug Fixes)",
      "rule affine_select.args"),
    C("0.6.0", "tensor_scalar_reduce takes reduce_res=None, keeping the VectorE accumulator (New Features)",
      "isa.tensor_scalar_reduce"),
    C("0.6.0", "nc_find_index8: an absent value gives all ones; duplicates advance (Bug Fixes)",
      "isa.nc_find_index8"),
    C("0.6.0", "nl.fori_loop / nl.while_loop replace dynamic_range loops (New Features; Deprecated)",
      "not emulated: runtime (register) loops; a kernel that needs one is refused naming it"),
    C("0.6.0", "nisa.topk on GpSimd (New Features)", "not emulated (no nki-library core kernel calls it)"),
)

RULES_BY_ID = {r.id: r for r in RULES}
assert len(RULES_BY_ID) == len(RULES), "duplicate rule id"


def check_reading(reading: str) -> str:
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}: expected one of {', '.join(READINGS)}")
    return reading


def spec(target: str) -> TargetSpec:
    if target not in TARGET_SPECS:
        raise ValueError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    return TARGET_SPECS[target]


def message(rule: Rule, detail: str) -> str:
    return f"[{rule.id}] {detail} (rule: {rule.checks}; source: aws-neuron-sdk {rule.source})"


def violate(rule_id: str, detail: str, target: str, location: str | None = None, reading: str = "any") -> None:
    """Raise NkiRuleError for `rule_id` at the kernel's line, unless the rule does not apply to `target` or (a
    strict row) to `reading`."""
    rule = RULES_BY_ID[rule_id]
    if target not in rule.targets or (rule.strict and reading != "strict"):
        return
    where = location or kernel_location()
    raise NkiRuleError(f"{where}: {message(rule, detail)}", rule, where)


def table(target: str | None = None, markdown: bool = False) -> str:
    rows = [r for r in RULES if target is None or target in r.targets]
    if markdown:
        lines = ["| id | checks | targets | source |", "|---|---|---|---|"]
        lines += [f"| `{r.id}` | {r.checks} | {', '.join(r.targets)} | {r.source} |" for r in rows]
    else:
        wrap = lambda text, first: textwrap.fill(text, TABLE_WIDTH, initial_indent=first, subsequent_indent=" " * 29)
        lines = [wrap(f"[{','.join(r.targets)}{'; strict' if r.strict else ''}] {r.checks}", f"{r.id:28s} ") + "\n"
                 + wrap(f"source: {r.source}", " " * 29)
                 + (f"\n{wrap(f'reading: {r.reading}', ' ' * 29)}" if r.reading else "") for r in rows]
    return "\n".join(lines)


TABLE_WIDTH = 100  # the plain table's lines (the Markdown one keeps each row on one line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels_nki.emulator",
                                description="List the NKI emulator's rules (one row per rule, with its AWS source).")
    p.add_argument("--target", choices=TARGETS, help="only the rules that apply to this target")
    p.add_argument("--markdown", action="store_true",
                   help="one Markdown table (what docs/kernels/emulator-rules.md carries), without the readings")
    p.add_argument("--changes", action="store_true", help=f"the NKI 0.3 -> {NKI_VERSION} differences followed")
    args = p.parse_args(argv)
    if args.changes:
        print("\n".join(f"NKI {c.version}: {c.what}\n    emulator: {c.emulator}" for c in CHANGES))
        return 0
    print(table(args.target, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
