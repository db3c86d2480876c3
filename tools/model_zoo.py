"""Write the model-zoo page, configs/README.md, from model-index.yml and metafiles/.

python tools/model_zoo.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deepvit_tools.model_zoo import PAGE, write  # noqa: E402

if __name__ == '__main__':
    write()
    print(f'wrote {os.path.relpath(PAGE)}')
