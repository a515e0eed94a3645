"""Job code hashes: a method's jobs depend on the code they run, found by parsing imports."""
from reprozoo import codehash, registry


def test_method_hash_covers_its_folder_and_the_blocks_it_imports():
    files = {str(p.relative_to(codehash.PACKAGE_DIR)) for p in codehash.method_code_files("rex")}
    assert "methods/rex/method.py" in files and "methods/rex/samplers.py" in files
    assert "blocks/ode.py" in files                      # imported by rex
    assert "data/synthetic/gmm.py" in files              # its dataset module, imported by the method
    assert not any(f.startswith("methods/dkmp") for f in files)
    assert not any(f.startswith("blocks/atomistic") for f in files)


def test_transitive_imports_are_followed():
    files = {str(p.relative_to(codehash.PACKAGE_DIR)) for p in codehash.method_code_files("dkmp")}
    # dkmp imports blocks.atomistic.dilated, which imports neighbors
    assert "blocks/atomistic/dilated.py" in files and "blocks/atomistic/neighbors.py" in files


def test_hash_changes_with_the_code(tmp_path, monkeypatch):
    pkg = tmp_path / "reprozoo"
    (pkg / "blocks").mkdir(parents=True)
    (pkg / "methods" / "m").mkdir(parents=True)
    for d in (pkg, pkg / "blocks", pkg / "methods", pkg / "methods" / "m"):
        (d / "__init__.py").write_text("")
    (pkg / "blocks" / "b.py").write_text("X = 1\n")
    (pkg / "blocks" / "unused.py").write_text("Y = 1\n")
    (pkg / "methods" / "m" / "method.py").write_text("from ...blocks.b import X\n")
    monkeypatch.setattr(codehash, "PACKAGE_DIR", pkg)
    for f in (codehash.method_code_files, codehash.method_code_hash, codehash.imports_of):
        f.cache_clear()
    h0 = codehash.method_code_hash("m")
    (pkg / "blocks" / "unused.py").write_text("Y = 2\n")
    codehash.method_code_hash.cache_clear(), codehash.imports_of.cache_clear(), codehash.method_code_files.cache_clear()
    assert codehash.method_code_hash("m") == h0          # not imported: no rerun
    (pkg / "blocks" / "b.py").write_text("X = 2\n")
    codehash.method_code_hash.cache_clear(), codehash.imports_of.cache_clear(), codehash.method_code_files.cache_clear()
    assert codehash.method_code_hash("m") != h0          # imported: rerun
    for f in (codehash.method_code_files, codehash.method_code_hash, codehash.imports_of):
        f.cache_clear()


def test_every_method_has_a_hash():
    for m in registry.method_ids():
        assert len(codehash.method_code_hash(m)) == 16
