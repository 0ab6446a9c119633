"""The third-party names kolibri uses that their packages do not promise to keep (private or
internal). pyproject.toml bounds each such package to the versions checked; when a new release
moves a name, its test here fails saying what moved, where kolibri uses it and what to update,
instead of a user's install breaking with a less telling error (or, for the numba hooks, kolibri
silently compiling into numba's folders again)."""

import re
from importlib.metadata import version


def _moved(what: str, package: str, where: str) -> str:
    return (f"{what} is not where kolibri expects it in {package} {version(package)}: kolibri "
            f"uses it in {where}; adapt that code, then the bound of {package} in pyproject.toml")


def test_gguf_quant_type_traits():
    """store/gguf.py asks `gguf.quants._type_traits` which tensor types the library dequantizes."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    traits = getattr(quants, "_type_traits", None)
    assert isinstance(traits, dict) and {Q.Q2_K, Q.Q4_K, Q.Q8_0} <= set(traits), _moved(
        "gguf.quants._type_traits (quant type -> its class)", "gguf", "kolibri_cli/store/gguf.py")
    assert Q.F32 not in traits and Q.F16 not in traits, _moved(
        "_type_traits without the float types", "gguf", "kolibri_cli/store/gguf.py")


def test_typer_vendored_click_exceptions():
    """cli/app.py's error boundary catches click's exceptions from `typer._click` (the copy of
    click typer carries since 0.26). They must be the classes typer raises."""
    import importlib

    import typer

    errors = importlib.import_module("kolibri_cli.cli.app").click_errors
    where = "kolibri_cli/cli/app.py"
    for name in ("ClickException", "UsageError", "NoArgsIsHelpError"):
        assert hasattr(errors, name), _moved(f"typer._click.exceptions.{name}", "typer", where)
    assert issubclass(typer.BadParameter, errors.UsageError), _moved(
        "the click whose UsageError typer raises (typer._click)", "typer", where)


def test_numba_cache_hook():
    """engine/jitcache.py replaces numba's `Dispatcher.enable_caching` for kolibri's functions
    with a `FunctionCache` whose implementation sets the three attributes numba's `CacheImpl`
    sets (`_lineno`, `_locator`, `_filename_base`) with kolibri's locator, which subclasses two
    private bases; a function whose folder cannot be made keeps numba's `NullCache`."""
    import inspect

    from numba.core import caching, dispatcher

    from kolibri_cli.engine import jitcache

    where = "kolibri_cli/engine/jitcache.py"
    for name in ("_CacheLocator", "_SourceFileBackedLocatorMixin", "CompileResultCacheImpl",
                 "FunctionCache", "NullCache"):
        assert hasattr(caching, name), _moved(f"numba.core.caching.{name}", "numba", where)
    assert dispatcher.Dispatcher.enable_caching is jitcache._enable_caching, _moved(
        "numba.core.dispatcher.Dispatcher.enable_caching", "numba", where)
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    set_ = set(re.findall(r"self\.(\w+)\s*=", inspect.getsource(impl.__init__)))
    assert set_ == {"_lineno", "_locator", "_filename_base"}, _moved(
        f"the attributes CacheImpl.__init__ sets ({sorted(set_)})", "numba", where)


def test_numba_runtime_hook():
    """engine/jitcache.py replaces `nrtdynmod.compile_nrt_functions`, which numba's runtime calls
    by that module attribute, and uses numba's codegen internals to cache the runtime's code."""
    import inspect

    from numba.core import codegen
    from numba.core.runtime import nrt, nrtdynmod

    from kolibri_cli.engine import jitcache

    where = "kolibri_cli/engine/jitcache.py"
    assert callable(getattr(nrtdynmod, "create_nrt_module", None)), _moved(
        "numba.core.runtime.nrtdynmod.create_nrt_module", "numba", where)
    assert nrtdynmod.compile_nrt_functions is jitcache.compile_nrt_functions, _moved(
        "nrtdynmod.compile_nrt_functions (kolibri's was not put there)", "numba", where)
    assert "nrtdynmod.compile_nrt_functions(" in inspect.getsource(nrt), _moved(
        "numba's runtime's call of nrtdynmod.compile_nrt_functions", "numba", where)
    for cls, names in ((codegen.JITCPUCodegen, ("magic_tuple", "unserialize_library")),
                       (codegen.CPUCodeLibrary, ("serialize_using_object_code",
                                                 "enable_object_caching", "add_ir_module",
                                                 "finalize"))):
        for name in names:
            assert hasattr(cls, name), _moved(f"numba.core.codegen.{cls.__name__}.{name}",
                                              "numba", where)


def test_numba_internals_of_the_simd_intrinsics():
    """engine/simd.py reads numba's target CPU features and the data pointer of an array
    argument through numba.core internals."""
    from numba.core import cgutils, codegen, config

    where = "kolibri_cli/engine/simd.py"
    assert callable(getattr(codegen, "get_host_cpu_features", None)), _moved(
        "numba.core.codegen.get_host_cpu_features", "numba", where)
    for name in ("create_struct_proxy", "get_or_insert_function", "get_item_pointer"):
        assert callable(getattr(cgutils, name, None)), _moved(f"numba.core.cgutils.{name}",
                                                              "numba", where)
    for name in ("CPU_NAME", "CPU_FEATURES", "CACHE_DIR", "BOUNDSCHECK", "OPT"):
        assert hasattr(config, name), _moved(f"numba.core.config.{name}", "numba",
                                             f"{where}, kolibri_cli/engine/jitcache.py")
