# Library headers include each other as "shardckpt/io/status.h", "shardckpt/engine/core/load.h": the
# path they have once installed under <prefix>/include, which cannot collide with a consumer's own
# io/ or engine/ folders. The build tree resolves the same paths through
# <build>/include/shardckpt/<folder>, one symbolic link per library folder to the source folder:
# - links, not copies: compiler errors and debuggers point at the real sources, and an edited
#   header needs no copy step to be seen;
# - one link per folder rather than one <build>/include/shardckpt -> <source root>: build/ lives
#   inside the source root, and a link to an ancestor makes a loop for anything that walks the
#   tree; it would also expose tools/, tests/ and benchmarks/ under shardckpt/, which are not
#   installed;
# - made at configure time and remade on every configure, so a moved build or source tree heals
#   by reconfiguring.
# A new library folder joins SHARDCKPT_LIBRARY_FOLDERS (and the install rules, cmake/Install.cmake).
set(SHARDCKPT_LIBRARY_FOLDERS io collectives engine)
set(SHARDCKPT_INCLUDE_ROOT ${PROJECT_BINARY_DIR}/include)
file(MAKE_DIRECTORY ${SHARDCKPT_INCLUDE_ROOT}/shardckpt)
foreach(folder ${SHARDCKPT_LIBRARY_FOLDERS})
  file(REMOVE ${SHARDCKPT_INCLUDE_ROOT}/shardckpt/${folder})
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${SHARDCKPT_INCLUDE_ROOT}/shardckpt/${folder} SYMBOLIC)
endforeach()
