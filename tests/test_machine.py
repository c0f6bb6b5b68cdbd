"""The kind of machine a result was made on: the same name on every host of one kind, another on another kind."""

from lmpipe.machine import cpu_kind


def cpuinfo(vendor: str, family: int, model_name: str, flags: str) -> str:
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel name\t: {model_name}\n"
            f"flags\t\t: fpu sse sse2 {flags}\n\nprocessor\t: 1\nvendor_id\t: {vendor}\n")


def test_a_cpu_is_named_by_vendor_family_and_widest_matrix_instructions_not_its_model_name():
    zen5 = cpu_kind(cpuinfo("AuthenticAMD", 26, "AMD EPYC 9R45", "avx2 avx512f avx512_bf16"))
    assert zen5 == "AMD family 26, AVX512-BF16"
    assert cpu_kind(cpuinfo("AuthenticAMD", 26, "AMD EPYC", "avx2 avx512f avx512_bf16")) == zen5  # another host
    assert cpu_kind(cpuinfo("GenuineIntel", 6, "Intel(R) Xeon(R) Platinum 8488C",
                            "avx2 avx512f avx512_bf16 amx_bf16 amx_tile")) == "Intel family 6, AMX"
    assert cpu_kind(cpuinfo("AuthenticAMD", 25, "AMD EPYC 7R13", "avx2 fma")) == "AMD family 25, AVX2"
    assert cpu_kind(cpuinfo("AuthenticAMD", 23, "AMD EPYC", "sse4_2")) == "AMD family 23, no AVX2"
